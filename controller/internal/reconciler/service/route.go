package service

import (
	"context"
	"fmt"
	"maps"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
)

// RouteTraffic is a Service's split as its Route says it: a target that
// follows the latest ready Revision names the Service as its
// configurationName (a Service is its own configuration); empty traffic
// is 100 % to the latest ready Revision.
func RouteTraffic(svc *servingv1alpha1.Service) []servingv1alpha1.TrafficTarget {
	traffic := svc.Spec.Traffic
	if len(traffic) == 0 {
		traffic = []servingv1alpha1.TrafficTarget{{Percent: ptr.To(int64(100))}}
	}
	out := make([]servingv1alpha1.TrafficTarget, len(traffic))
	for i, t := range traffic {
		t = *t.DeepCopy()
		if t.RevisionName == "" {
			t.ConfigurationName, t.LatestRevision = svc.Name, ptr.To(true)
		}
		out[i] = t
	}
	return out
}

// MakeRoute is the Route of svc: its name, its split, and its
// rollout-duration annotation. The caller sets the controller reference.
func MakeRoute(svc *servingv1alpha1.Service) *servingv1alpha1.Route {
	rt := &servingv1alpha1.Route{
		ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: svc.Name, Labels: map[string]string{servingv1alpha1.ServiceLabelKey: svc.Name}},
		Spec:       servingv1alpha1.RouteSpec{Traffic: RouteTraffic(svc)},
	}
	if d, ok := svc.Annotations[servingv1alpha1.RolloutDurationAnnotation]; ok {
		rt.Annotations = map[string]string{servingv1alpha1.RolloutDurationAnnotation: d}
	}
	return rt
}

// ensureRoute creates or corrects svc's Route and returns it (nil while
// it is being created, or when the name is someone else's: then the
// returned Route is that one, not controlled by svc).
func (r *Reconciler) ensureRoute(ctx context.Context, svc *servingv1alpha1.Service) (*servingv1alpha1.Route, error) {
	want := MakeRoute(svc)
	var have servingv1alpha1.Route
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), &have)
	switch {
	case apierrors.IsNotFound(err):
		if err := controllerutil.SetControllerReference(svc, want, r.Client.Scheme()); err != nil {
			return nil, err
		}
		if err := r.Client.Create(ctx, want); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create Route %s: %w", want.Name, err)
		}
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("get Route %s: %w", want.Name, err)
	case !metav1.IsControlledBy(&have, svc):
		return &have, nil
	}
	annotationsHold := have.Annotations[servingv1alpha1.RolloutDurationAnnotation] == want.Annotations[servingv1alpha1.RolloutDurationAnnotation]
	if equality.Semantic.DeepEqual(have.Spec, want.Spec) && annotationsHold && have.Labels[servingv1alpha1.ServiceLabelKey] == svc.Name {
		return &have, nil
	}
	have.Spec = want.Spec
	if have.Labels == nil {
		have.Labels = map[string]string{}
	}
	maps.Copy(have.Labels, want.Labels)
	if d, ok := want.Annotations[servingv1alpha1.RolloutDurationAnnotation]; ok {
		if have.Annotations == nil {
			have.Annotations = map[string]string{}
		}
		have.Annotations[servingv1alpha1.RolloutDurationAnnotation] = d
	} else {
		delete(have.Annotations, servingv1alpha1.RolloutDurationAnnotation)
	}
	if err := r.Client.Update(ctx, &have); err != nil {
		if apierrors.IsConflict(err) {
			return &have, nil // the next reconcile corrects it
		}
		return nil, fmt.Errorf("update Route %s: %w", have.Name, err)
	}
	return &have, nil
}

// routeStatus copies where the traffic goes from the Route, and its
// readiness into RoutesReady.
func routeStatus(s *servingv1alpha1.ServiceStatus, svc *servingv1alpha1.Service, rt *servingv1alpha1.Route) {
	gen := svc.Generation
	switch {
	case rt == nil:
		setCondition(s, gen, ConditionRoutesReady, metav1.ConditionUnknown, ReasonRouteCreating, fmt.Sprintf("Route %q is being created", svc.Name))
		return
	case !metav1.IsControlledBy(rt, svc):
		setCondition(s, gen, ConditionRoutesReady, metav1.ConditionFalse, ReasonRouteNotOwned,
			fmt.Sprintf("Route %q exists and does not belong to this Service: delete it so the Service can make its own", rt.Name))
		return
	}
	s.RouteStatusFields = *rt.Status.RouteStatusFields.DeepCopy()
	c := meta.FindStatusCondition(rt.Status.Conditions, names.ConditionReady)
	switch {
	case c == nil || c.ObservedGeneration != rt.Generation:
		setCondition(s, gen, ConditionRoutesReady, metav1.ConditionUnknown, ReasonRouteCreating, fmt.Sprintf("Route %q has not reported on its current spec yet", rt.Name))
	case c.Status == metav1.ConditionTrue && !migrated(rt.Status.Traffic, s.LatestReadyRevisionName):
		// The Service has a new latest ready Revision the Route has not
		// taken up yet (its next reconcile will): not Ready meanwhile.
		setCondition(s, gen, ConditionRoutesReady, metav1.ConditionUnknown, ReasonTrafficNotMigrated,
			fmt.Sprintf("Traffic is not yet migrated to %s.", s.LatestReadyRevisionName))
	default:
		setCondition(s, gen, ConditionRoutesReady, c.Status, c.Reason, c.Message)
	}
}

// migrated says whether a split that follows the latest ready Revision
// (a latestRevision target) names latest; a split with no such target
// has nothing to migrate.
func migrated(traffic []servingv1alpha1.TrafficTargetStatus, latest string) bool {
	follows := false
	for _, t := range traffic {
		if t.LatestRevision != nil && *t.LatestRevision {
			if t.RevisionName == latest {
				return true
			}
			follows = true
		}
	}
	return !follows || latest == ""
}

// setReady is Ready from ConfigurationsReady and RoutesReady, as Knative
// does: False if either is False (the configuration's first), else
// Unknown if either is Unknown (e.g. RolloutInProgress), else True.
func setReady(s *servingv1alpha1.ServiceStatus, gen int64) {
	cfg := meta.FindStatusCondition(s.Conditions, ConditionConfigurationsReady)
	rts := meta.FindStatusCondition(s.Conditions, ConditionRoutesReady)
	pick := func(st metav1.ConditionStatus) *metav1.Condition {
		for _, c := range []*metav1.Condition{cfg, rts} {
			if c != nil && c.Status == st {
				return c
			}
		}
		return nil
	}
	c := pick(metav1.ConditionFalse)
	if c == nil {
		c = pick(metav1.ConditionUnknown)
	}
	if c == nil {
		setCondition(s, gen, names.ConditionReady, metav1.ConditionTrue, cfg.Reason, "the latest Revision is ready and the Route splits the traffic as spec.traffic says")
		return
	}
	setCondition(s, gen, names.ConditionReady, c.Status, c.Reason, c.Message)
}
