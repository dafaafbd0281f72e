package kpa

import (
	"context"
	"fmt"
	"math"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/decider"
)

// LabelPodAutoscaler marks the HorizontalPodAutoscalers the HPA class
// makes with the name of their PodAutoscaler: the controller caches only
// HPAs that carry it. Anyone can set a label, so ownership is still
// checked by the controller reference.
const LabelPodAutoscaler = "autoscaling.sockscale.dev/podautoscaler"

// ConditionHPA mirrors, for the HPA class, the ScalingActive condition of
// the target's HorizontalPodAutoscaler: whether the HPA can read its
// metric and compute a count (False with ScalingDisabled while the target
// is at zero, where sockscale decides).
const ConditionHPA = "HPAScalingActive"

// makeHPA is the HorizontalPodAutoscaler of an HPA-class target: it scales
// what the PodAutoscaler scales (its scaleTargetRef, of any kind with
// /scale, as the HPA reads it) from max(min-scale, 1) (an HPA cannot take
// a target to zero, and at zero it stops: sockscale keeps that end) up to
// max-scale on
// the target's metric. Concurrency and rps are the agents' per-pod values
// from the custom metrics API, aimed at the value the KPA would aim at
// (target x utilization: target 10 at 70 % is an average of 7 per pod);
// cpu is a utilization of the pods' requests and memory an average in
// mebibytes, from the resource metrics API (as Knative's HPA class). Its
// scale-down stabilization is the stable window, so a load that goes
// takes pods away as soon as with the KPA (the HPA's own default is
// 300 s).
func makeHPA(pa *v1alpha1.PodAutoscaler, s config.Settings) *autoscalingv2.HorizontalPodAutoscaler {
	ref := pa.Spec.ScaleTargetRef
	maxReplicas := s.MaxScale
	if maxReplicas == 0 {
		maxReplicas = math.MaxInt32
	}
	window := int32(s.StableWindow.Seconds())
	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: pa.Namespace, Name: pa.Name, Labels: map[string]string{LabelPodAutoscaler: pa.Name}},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: ref.APIVersion, Kind: ref.Kind, Name: ref.Name},
			MinReplicas:    ptr.To(max(s.MinScale, 1)),
			MaxReplicas:    maxReplicas,
			Metrics:        []autoscalingv2.MetricSpec{hpaMetric(s)},
			Behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{
				ScaleDown: &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: &window},
			},
		},
	}
	return hpa
}

// hpaMetric is the HPA's metric for s.Metric with s.HPATarget.
func hpaMetric(s config.Settings) autoscalingv2.MetricSpec {
	switch s.Metric {
	case config.MetricCPU:
		return autoscalingv2.MetricSpec{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{
			Name:   corev1.ResourceCPU,
			Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To(int32(s.HPATarget))},
		}}
	case config.MetricMemory:
		mib := resource.NewQuantity(int64(math.Ceil(s.HPATarget*(1<<20))), resource.BinarySI)
		return autoscalingv2.MetricSpec{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{
			Name:   corev1.ResourceMemory,
			Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: mib},
		}}
	}
	// Thousandths, the precision a Quantity keeps: 7 is "7", 0.01 "10m".
	value := resource.NewMilliQuantity(int64(math.Round(s.HPATarget*1000)), resource.DecimalSI)
	return autoscalingv2.MetricSpec{Type: autoscalingv2.PodsMetricSourceType, Pods: &autoscalingv2.PodsMetricSource{
		Metric: autoscalingv2.MetricIdentifier{Name: s.Metric},
		Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: value},
	}}
}

// ensureHPA makes or corrects the target's HorizontalPodAutoscaler (named
// after the PodAutoscaler, controlled by it) and returns it with its
// status. One of that name that is not the PodAutoscaler's is left alone
// (errNotOwned): a user's own HPA is never taken over.
func (r *PodAutoscaler) ensureHPA(ctx context.Context, pa *v1alpha1.PodAutoscaler, want *autoscalingv2.HorizontalPodAutoscaler) (*autoscalingv2.HorizontalPodAutoscaler, error) {
	have := &autoscalingv2.HorizontalPodAutoscaler{}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), have)
	if apierrors.IsNotFound(err) {
		if err := controllerutil.SetControllerReference(pa, want, r.Client.Scheme()); err != nil {
			return nil, err
		}
		err = r.Client.Create(ctx, want)
		if err == nil {
			return want, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create HorizontalPodAutoscaler %s: %w", want.Name, err)
		}
		// The cache holds only labelled HPAs, and may not have seen the
		// one this PodAutoscaler made a moment ago: the API server says
		// whose it is.
		err = r.reader().Get(ctx, client.ObjectKeyFromObject(want), have)
	}
	switch {
	case err != nil:
		return nil, err
	case !metav1.IsControlledBy(have, pa):
		return nil, fmt.Errorf("HorizontalPodAutoscaler %q exists and is not controlled by PodAutoscaler %q (delete it, or the PodAutoscaler, whichever should not scale the target): %w", have.Name, pa.Name, errNotOwned)
	case equality.Semantic.DeepEqual(have.Spec, want.Spec) && have.Labels[LabelPodAutoscaler] == pa.Name:
		return have, nil
	}
	have.Spec = want.Spec
	if have.Labels == nil {
		have.Labels = map[string]string{}
	}
	have.Labels[LabelPodAutoscaler] = pa.Name
	if err := r.Client.Update(ctx, have); err != nil {
		return nil, fmt.Errorf("update HorizontalPodAutoscaler %s: %w", have.Name, err)
	}
	return have, nil
}

// reader is APIReader, else Client.
func (r *PodAutoscaler) reader() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
}

// removeHPA deletes the HorizontalPodAutoscaler the PodAutoscaler made
// while it was of the HPA class, now that the KPA decides (two
// autoscalers writing one /scale would undo each other's counts). Only
// one it controls: a user's HPA of the same name stays.
func (r *PodAutoscaler) removeHPA(ctx context.Context, pa *v1alpha1.PodAutoscaler) error {
	hpa := &autoscalingv2.HorizontalPodAutoscaler{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: pa.Namespace, Name: pa.Name}, hpa)
	if apierrors.IsNotFound(err) || err == nil && !metav1.IsControlledBy(hpa, pa) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := r.Client.Delete(ctx, hpa, client.Preconditions{UID: &hpa.UID}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete HorizontalPodAutoscaler %s, left from the HPA class: %w", hpa.Name, err)
	}
	return nil
}

// hpaWish is the count an HPA-class target should have before the
// scale-to-zero rules: the HPA owns every count from 1 up, so sockscale
// keeps the Deployment's (current) except at the two ends it owns. At
// zero, load (a poke from the activator) brings what the KPA would bring
// (at least 1, the activation scale, min-scale) at once, without waiting
// for the HPA's next sync, which ignores a Deployment at zero anyway. With
// pods and not a request over the stable window (idle), 0 unless min-scale
// or a cluster without scale to zero keeps pods: the zero rules then decide
// when the last pods go. The decider's own count is no use there: it steps
// down at max-scale-down-rate (4 pods ready: 2 at the lowest), which is
// the HPA's business.
//
// Example: current 3, stable concurrency 12, HPA aiming at 7: 3 (the HPA
// will make it 2); current 0 and a poke with activation-scale 3: 3;
// current 4 and a stable window without a request: 0 (then the 4 pods
// stay through the grace period and go together).
func hpaWish(dec decider.Decision, idle bool, s config.Settings, current int32, initialized, reachable bool) int32 {
	if current == 0 {
		return bounded(dec, s, current, initialized, reachable)
	}
	if idle && dec.Valid {
		zero := dec
		zero.DesiredScale = 0
		if bounded(zero, s, current, initialized, reachable) == 0 {
			return 0
		}
	}
	return current
}

// hpaCondition is ConditionHPA from the HPA's ScalingActive condition.
func hpaCondition(hpa *autoscalingv2.HorizontalPodAutoscaler) (metav1.ConditionStatus, string, string) {
	for _, c := range hpa.Status.Conditions {
		if c.Type == autoscalingv2.ScalingActive {
			return metav1.ConditionStatus(c.Status), c.Reason, "HorizontalPodAutoscaler " + hpa.Name + ": " + c.Message
		}
	}
	return metav1.ConditionUnknown, "Pending", fmt.Sprintf("HorizontalPodAutoscaler %s has not been looked at by the HPA controller yet", hpa.Name)
}
