package reconciler

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sockscale/sockscale/controller/api/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/decider"
)

// TickPeriod is how often each target is decided (KPA.md: every 2 s).
const TickPeriod = 2 * time.Second

// Condition types and reasons of a PodAutoscaler.
const (
	ConditionReady       = "Ready"
	ConditionInitialized = "ScaleTargetInitialized"
)

// PodAutoscaler reconciles PodAutoscalers.
type PodAutoscaler struct {
	Client    client.Client
	Collector *collector.Collector
	Clock     clock.PassiveClock
	// Config returns the cluster defaults in force.
	Config func() *config.Config
	// Metrics, if set, get each decision.
	Metrics *Metrics

	mu      sync.Mutex
	targets map[collector.Key]*targetState // by PodAutoscaler
}

// targetState is what a PodAutoscaler's ticks carry over.
type targetState struct {
	decider *decider.Decider
	// collected is the collector's key: the Deployment's name.
	collected collector.Key
}

var _ reconcile.Reconciler = (*PodAutoscaler)(nil)

// +kubebuilder:rbac:groups=sockscale.dev,resources=podautoscalers,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=sockscale.dev,resources=podautoscalers/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=deployments/scale,verbs=get;update;patch

// Reconcile decides one target and scales it.
func (r *PodAutoscaler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	key := collector.Key{Namespace: req.Namespace, Name: req.Name}
	var pa v1alpha1.PodAutoscaler
	if err := r.Client.Get(ctx, req.NamespacedName, &pa); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(key)
			r.Metrics.forget(req.Namespace, req.Name)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	now := r.Clock.Now()
	started := time.Now() // the decision's latency is wall time, whatever Clock says
	status := pa.Status.DeepCopy()
	status.ObservedGeneration = pa.Generation

	deploy, reason, msg := r.target(ctx, &pa)
	if deploy == nil {
		setCondition(status, pa.Generation, ConditionReady, metav1.ConditionFalse, reason, msg)
		return ctrl.Result{RequeueAfter: 10 * time.Second}, r.writeStatus(ctx, &pa, status)
	}
	settings, err := r.settings(&pa, deploy)
	if err != nil {
		setCondition(status, pa.Generation, ConditionReady, metav1.ConditionFalse, "InvalidSettings", err.Error())
		return ctrl.Result{}, r.writeStatus(ctx, &pa, status)
	}
	// The collector keys targets by their Deployment, as agents report pods.
	tkey := collector.Key{Namespace: pa.Namespace, Name: deploy.Name}
	if err := r.Collector.Watch(tkey, settings); err != nil {
		return ctrl.Result{}, err
	}
	ready := deploy.Status.ReadyReplicas
	d := r.decider(key, tkey, settings, ready, now)
	values, err := r.Collector.Values(tkey, now)
	if err != nil {
		return ctrl.Result{}, err
	}
	dec := d.Decide(now, decider.Inputs{ReadyPods: ready, Stable: values.Stable, Panic: values.Panic, HasData: values.HasData, Reachable: true})

	current := int32(1)
	if deploy.Spec.Replicas != nil {
		current = *deploy.Spec.Replicas
	}
	initialized := meta.IsStatusConditionTrue(status.Conditions, ConditionInitialized) || ready >= settings.InitialScale
	want := bounded(dec, settings, current, initialized)
	if want != current {
		if err := r.scale(ctx, deploy, want); err != nil {
			return ctrl.Result{}, err
		}
		log.FromContext(ctx).Info("scaled", "target", deploy.Name, "from", current, "to", want,
			"stable", values.Stable, "panic", values.Panic, "panicking", dec.Panicking)
	}

	r.Metrics.record(pa.Namespace, pa.Name, want, values.Stable, values.Panic, dec.ExcessBurstCapacity, dec.Panicking, time.Since(started).Seconds())
	status.DesiredScale = ptr(want)
	status.ActualScale = ptr(ready)
	status.StableValue = strconv.FormatFloat(values.Stable, 'f', 3, 64)
	status.PanicValue = strconv.FormatFloat(values.Panic, 'f', 3, 64)
	status.Panicking = dec.Panicking
	if dec.Valid {
		status.ExcessBurstCapacity = ptr(dec.ExcessBurstCapacity)
	}
	if initialized {
		setCondition(status, pa.Generation, ConditionInitialized, metav1.ConditionTrue, "Initialized", fmt.Sprintf("the target reached its initial scale of %d", settings.InitialScale))
	} else {
		setCondition(status, pa.Generation, ConditionInitialized, metav1.ConditionFalse, "Initializing", fmt.Sprintf("%d of the initial %d pods are ready", ready, settings.InitialScale))
	}
	switch {
	case !values.HasData:
		setCondition(status, pa.Generation, ConditionReady, metav1.ConditionTrue, "NoData", "no stats have arrived for the target yet; keeping its scale")
	case ready < want:
		setCondition(status, pa.Generation, ConditionReady, metav1.ConditionTrue, "ScalingUp", fmt.Sprintf("%d of %d pods ready", ready, want))
	default:
		setCondition(status, pa.Generation, ConditionReady, metav1.ConditionTrue, "Scaled", fmt.Sprintf("%d pods for a stable %s of %.3f", want, settings.Metric, values.Stable))
	}
	return ctrl.Result{RequeueAfter: TickPeriod}, r.writeStatus(ctx, &pa, status)
}

// target returns the Deployment to scale, or why there is none.
func (r *PodAutoscaler) target(ctx context.Context, pa *v1alpha1.PodAutoscaler) (*appsv1.Deployment, string, string) {
	ref := pa.Spec.ScaleTargetRef
	if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" {
		return nil, "UnsupportedScaleTarget", fmt.Sprintf("scaleTargetRef %s %s: only apps/v1 Deployments are supported so far", ref.APIVersion, ref.Kind)
	}
	var d appsv1.Deployment
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: pa.Namespace, Name: ref.Name}, &d); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, "ScaleTargetNotFound", fmt.Sprintf("Deployment %q does not exist in namespace %q", ref.Name, pa.Namespace)
		}
		return nil, "ScaleTargetUnreadable", err.Error()
	}
	return &d, "", ""
}

// settings merges the cluster config, the pod template's annotations and
// the spec.
func (r *PodAutoscaler) settings(pa *v1alpha1.PodAutoscaler, d *appsv1.Deployment) (config.Settings, error) {
	ann, err := config.ParseAnnotations(d.Spec.Template.Annotations)
	if err != nil {
		return config.Settings{}, fmt.Errorf("pod template of Deployment %s: %w", d.Name, err)
	}
	return config.Effective(r.Config(), pa.Spec.ContainerConcurrency, ann, specOverrides(&pa.Spec))
}

func specOverrides(s *v1alpha1.PodAutoscalerSpec) *config.Overrides {
	o := &config.Overrides{
		MinScale: s.MinScale, MaxScale: s.MaxScale, InitialScale: s.InitialScale, ActivationScale: s.ActivationScale,
		Target: s.Target, TargetUtilizationPercentage: s.TargetUtilizationPercentage, TargetBurstCapacity: s.TargetBurstCapacity,
		PanicWindowPercentage: s.PanicWindowPercentage, PanicThresholdPercentage: s.PanicThresholdPercentage,
	}
	if s.Metric != "" {
		o.Metric = &s.Metric
	}
	if s.MetricAggregationAlgorithm != "" {
		o.Aggregation = &s.MetricAggregationAlgorithm
	}
	if s.ScaleDownDelay != nil {
		o.ScaleDownDelay = &s.ScaleDownDelay.Duration
	}
	if s.Window != nil {
		o.Window = &s.Window.Duration
	}
	if s.ScaleToZeroPodRetentionPeriod != nil {
		o.ScaleToZeroPodRetentionPeriod = &s.ScaleToZeroPodRetentionPeriod.Duration
	}
	return o
}

// bounded applies the target's bounds to a decision. Without data the
// current scale stays. min-scale applies (the target is reachable in Serve
// mode), max-scale caps, and until the target first reaches its initial
// scale it is not taken below it. Scale to zero needs an activator in the
// path to hold the next request (KPA.md's scale-to-zero rules); until the
// activator exists the last pod stays.
func bounded(dec decider.Decision, s config.Settings, current int32, initialized bool) int32 {
	if !dec.Valid || dec.DesiredScale < 0 {
		return current
	}
	want := max(dec.DesiredScale, s.MinScale, 1)
	if !initialized {
		want = max(want, s.InitialScale)
	}
	if s.MaxScale > 0 {
		want = min(want, s.MaxScale)
	}
	return want
}

// decider returns the PodAutoscaler's decider, made on its first tick (a
// busy target starts in panic, see decider.New).
func (r *PodAutoscaler) decider(key, collected collector.Key, s config.Settings, ready int32, now time.Time) *decider.Decider {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.targets == nil {
		r.targets = make(map[collector.Key]*targetState)
	}
	t, ok := r.targets[key]
	if !ok {
		t = &targetState{decider: decider.New(s, ready, now, log.Log.WithName("decider").WithValues("podautoscaler", key.String()))}
		r.targets[key] = t
	}
	if t.collected != collected && t.collected != (collector.Key{}) {
		r.Collector.Forget(t.collected) // the PodAutoscaler now points elsewhere
	}
	t.collected = collected
	t.decider.Update(s)
	return t.decider
}

// forget drops a deleted PodAutoscaler's state.
func (r *PodAutoscaler) forget(key collector.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.targets[key]; ok {
		r.Collector.Forget(t.collected)
		delete(r.targets, key)
	}
}

// scale sets the Deployment's replicas through its /scale subresource.
func (r *PodAutoscaler) scale(ctx context.Context, d *appsv1.Deployment, replicas int32) error {
	sc := &autoscalingv1.Scale{}
	if err := r.Client.SubResource("scale").Get(ctx, d, sc); err != nil {
		return fmt.Errorf("get scale of %s: %w", d.Name, err)
	}
	sc.Spec.Replicas = replicas
	if err := r.Client.SubResource("scale").Update(ctx, d, client.WithSubResourceBody(sc)); err != nil {
		return fmt.Errorf("scale %s to %d: %w", d.Name, replicas, err)
	}
	return nil
}

// writeStatus writes status if it changed: every target ticks every 2 s,
// and an idle one should not cost the API server a write each time.
func (r *PodAutoscaler) writeStatus(ctx context.Context, pa *v1alpha1.PodAutoscaler, status *v1alpha1.PodAutoscalerStatus) error {
	if equality.Semantic.DeepEqual(&pa.Status, status) {
		return nil
	}
	pa.Status = *status
	if err := r.Client.Status().Update(ctx, pa); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("update status of %s: %w", pa.Name, err)
	}
	return nil
}

func setCondition(s *v1alpha1.PodAutoscalerStatus, gen int64, typ string, st metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg, ObservedGeneration: gen})
}

func ptr[T any](v T) *T { return &v }
