package route

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/reconciler/route/rollout"
)

// ReasonInvalidRolloutDuration says the rollout-duration annotation
// cannot be read; the cluster's rollout-duration applies meanwhile.
const ReasonInvalidRolloutDuration = "InvalidRolloutDuration"

// rolloutMessage is Ready's message while a rollout runs (Knative's).
const rolloutMessage = "A gradual rollout of the latest revision(s) is in progress."

// rolloutDuration is the Route's rollout-duration: its annotation (the
// Service copies its own), else the cluster's. As in Knative, an
// annotation of 0 also means the cluster's. A bad annotation is a
// problem, and the cluster's applies.
func (r *Reconciler) rolloutDuration(rt *servingv1alpha1.Route) (time.Duration, *problem) {
	cluster := config.Defaults().RolloutDuration
	if r.Config != nil {
		cluster = r.Config().RolloutDuration
	}
	v, ok := rt.Annotations[servingv1alpha1.RolloutDurationAnnotation]
	if !ok {
		return cluster, nil
	}
	d, err := config.ParseRolloutDuration(v)
	if err != nil {
		return cluster, &problem{metav1.ConditionFalse, ReasonInvalidRolloutDuration,
			fmt.Sprintf("annotation %s: value %q %v; the cluster's rollout-duration (%s) applies meanwhile", servingv1alpha1.RolloutDurationAnnotation, v, err, cluster)}
	}
	if d == 0 {
		return cluster, nil
	}
	return d, nil
}

// step runs the gradual rollout (package rollout) from the state kept in
// the Route's annotation. The split the state describes counts as in
// effect once a reconcile has written it: status first, then the
// annotation, so an annotation present means its split reached status,
// where the agents take it from within milliseconds (Knative waits for
// its Ingress to be Ready instead; its first step's duration sets the
// pace, so here the pace is set by how fast the API server takes the
// writes, at least 1 s).
func (r *Reconciler) step(ctx context.Context, rt *servingv1alpha1.Route, goal []servingv1alpha1.TrafficTargetStatus, duration time.Duration, now time.Time) rollout.Result {
	raw, kept := rt.Annotations[rollout.AnnotationKey]
	prev, err := rollout.Decode(raw)
	if err != nil {
		// The goal holds at once; the next state replaces the bad one.
		log.FromContext(ctx).Info("ignoring the Route's rollout state", "annotation", rollout.AnnotationKey, "error", err.Error())
		prev, kept = nil, false
	}
	return rollout.Step(prev, goal, now, duration, kept && len(rt.Status.Traffic) > 0)
}

// keepState writes the rollout state into the Route's annotation when
// it changed (after status, see step).
func (r *Reconciler) keepState(ctx context.Context, rt *servingv1alpha1.Route, s *rollout.State) error {
	enc, err := rollout.Encode(s)
	if err != nil {
		return err
	}
	if rt.Annotations[rollout.AnnotationKey] == enc {
		return nil
	}
	patch := client.MergeFrom(rt.DeepCopy())
	if rt.Annotations == nil {
		rt.Annotations = map[string]string{}
	}
	rt.Annotations[rollout.AnnotationKey] = enc
	if err := r.Client.Patch(ctx, rt, patch); err != nil {
		return fmt.Errorf("keep the rollout state of Route %s: %w", rt.Name, err)
	}
	return nil
}
