package kpa

import (
	"context"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

// ConditionReachable says whether traffic can reach the target.
const ConditionReachable = "Reachable"

// Reasons of the Reachable condition.
const (
	ReasonReachable             = "Reachable"
	ReasonNoPublicService       = "PublicServiceNotFound"
	ReasonScaleTargetFailing    = "ScaleTargetFailing"
	ReasonReachabilityUnchecked = "Unknown"
	ReasonNotRouted             = "NotRouted"
)

// reach is whether traffic can reach a target: Knative's Reachability,
// read from what sockscale has instead of Routes. Unreachable targets
// scale down without rate limit or scale-down delay, and min-scale,
// initial scale and the pod retention period do not hold them up (all as
// in Knative for a Revision no Route sends traffic to).
type reach struct {
	ok bool
	// noPath: the public Service does not exist, so no request can come
	// in, not even through an activator; the last pod need not wait for
	// one to be in the path.
	noPath          bool
	reason, message string
}

// reachable decides reach. A target is unreachable when its public
// Service does not exist (clients have nothing to call), when its spec
// says so (a Revision no Route sends traffic to), or, like a
// Knative Revision whose resources failed, when its Deployment wants pods,
// has none ready and reports that it cannot make progress (Progressing
// False with ProgressDeadlineExceeded, or ReplicaFailure True; other
// kinds' conditions are not read: they have no common shape). When it
// cannot tell (the Service cannot be read) it counts the target as
// reachable, as Knative does with an unknown reachability.
func (r *PodAutoscaler) reachable(ctx context.Context, pa *v1alpha1.PodAutoscaler, tgt *target) reach {
	var svc corev1.Service
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: pa.Namespace, Name: pa.Spec.Service.Name}, &svc)
	switch {
	case apierrors.IsNotFound(err):
		return reach{noPath: true, reason: ReasonNoPublicService,
			message: fmt.Sprintf("Service %q does not exist: no traffic can reach the target, so it scales down at once and min-scale does not apply", pa.Spec.Service.Name)}
	case err != nil:
		log.FromContext(ctx).V(1).Info("cannot read the public Service; counting the target as reachable", "service", pa.Spec.Service.Name, "error", err.Error())
		return reach{ok: true, reason: ReasonReachabilityUnchecked, message: "the public Service could not be read: " + err.Error()}
	}
	if pa.Spec.Reachability == v1alpha1.ReachabilityUnreachable {
		return reach{reason: ReasonNotRouted,
			message: "spec.reachability is Unreachable (no Route sends the target traffic): it scales down at once and min-scale does not apply"}
	}
	if tgt.failing != "" {
		return reach{reason: ReasonScaleTargetFailing,
			message: fmt.Sprintf("%s has no ready pod and %s: the target is unreachable until it recovers", tgt, tgt.failing)}
	}
	return reach{ok: true, reason: ReasonReachable, message: fmt.Sprintf("clients reach the target through Service %q", pa.Spec.Service.Name)}
}

// failing says why a Deployment that wants pods has none ready and will
// not get one, or "".
func failing(d *appsv1.Deployment) string {
	if d.Spec.Replicas != nil && *d.Spec.Replicas == 0 || d.Status.ReadyReplicas > 0 {
		return ""
	}
	for _, c := range d.Status.Conditions {
		switch {
		case c.Type == appsv1.DeploymentProgressing && c.Status == corev1.ConditionFalse && c.Reason == "ProgressDeadlineExceeded":
			return "exceeded its progress deadline: " + c.Message
		case c.Type == appsv1.DeploymentReplicaFailure && c.Status == corev1.ConditionTrue:
			return "cannot create pods: " + c.Message
		}
	}
	return ""
}
