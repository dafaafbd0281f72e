package revision

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

// reachability is the Revision's routing state, Knative's, for its
// PodAutoscaler:
//   - Reachable when a Route's split in effect gives it a share or a tag;
//   - unset (unknown, counted as reachable) while it is new: no Service
//     controls it, or it is its Service's latest created or latest ready
//     Revision, which its Route is about to take up;
//   - Unreachable otherwise: an old Revision nothing routes to. It then
//     scales to zero although min-scale says otherwise.
func (r *Reconciler) reachability(ctx context.Context, rev *servingv1alpha1.Revision) (v1alpha1.Reachability, error) {
	var routes servingv1alpha1.RouteList
	if err := r.Client.List(ctx, &routes, client.InNamespace(rev.Namespace)); err != nil {
		return "", fmt.Errorf("list Routes: %w", err)
	}
	for _, rt := range routes.Items {
		for _, t := range rt.Status.Traffic {
			if t.RevisionName == rev.Name && (t.Tag != "" || t.Percent != nil && *t.Percent > 0) {
				return v1alpha1.ReachabilityReachable, nil
			}
		}
	}
	owner := metav1.GetControllerOf(rev)
	if owner == nil || owner.Kind != "Service" || owner.APIVersion != servingv1alpha1.GroupVersion.String() {
		return "", nil
	}
	var svc servingv1alpha1.Service
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: rev.Namespace, Name: owner.Name}, &svc); err != nil {
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		return "", fmt.Errorf("get Service %s: %w", owner.Name, err)
	}
	if svc.Status.LatestCreatedRevisionName == rev.Name || svc.Status.LatestReadyRevisionName == rev.Name {
		return "", nil
	}
	return v1alpha1.ReachabilityUnreachable, nil
}

// setRoutingState records reach as Knative's routing state, and when it
// changed.
func setRoutingState(s *servingv1alpha1.RevisionStatus, reach v1alpha1.Reachability, now metav1.Time) {
	state := servingv1alpha1.RoutingStatePending
	switch reach {
	case v1alpha1.ReachabilityReachable:
		state = servingv1alpha1.RoutingStateActive
	case v1alpha1.ReachabilityUnreachable:
		state = servingv1alpha1.RoutingStateReserve
	}
	if s.RoutingState != state || s.RoutingStateModified == nil {
		s.RoutingState, s.RoutingStateModified = state, &now
	}
}

// routedRevisions maps a Route to the Revisions its split names (called
// with the old and the new Route on an update, so a Revision that lost
// its share is looked at too).
func routedRevisions(_ context.Context, o client.Object) []reconcile.Request {
	rt, ok := o.(*servingv1alpha1.Route)
	if !ok {
		return nil
	}
	out := make([]reconcile.Request, 0, len(rt.Status.Traffic))
	for _, t := range rt.Status.Traffic {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKey{Namespace: rt.Namespace, Name: t.RevisionName}})
	}
	return out
}

// servicesRevisions maps a Service to the Revisions it made.
func (r *Reconciler) servicesRevisions(ctx context.Context, o client.Object) []reconcile.Request {
	var list servingv1alpha1.RevisionList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingLabels{servingv1alpha1.ServiceLabelKey: o.GetName()}); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}
