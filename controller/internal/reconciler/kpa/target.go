package kpa

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/collect"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
	"github.com/sockscale/sockscale/controller/internal/scaletarget"
)

// Reasons of the Ready condition of a PodAutoscaler whose target cannot
// be scaled.
const (
	// ReasonUnsupportedScaleTarget: the scaleTargetRef is malformed, names
	// a kind the API server does not serve, or one without /scale.
	ReasonUnsupportedScaleTarget = "UnsupportedScaleTarget"
	// ReasonScaleTargetNotAllowed: the kind is not among those the
	// cluster lets PodAutoscalers name (the controller's
	// --scale-target-kinds).
	ReasonScaleTargetNotAllowed = "ScaleTargetNotAllowed"
	// ReasonScaleTargetForbidden: the controller's ClusterRole does not
	// grant the kind's /scale.
	ReasonScaleTargetForbidden  = "ScaleTargetForbidden"
	ReasonScaleTargetNotFound   = "ScaleTargetNotFound"
	ReasonScaleTargetUnreadable = "ScaleTargetUnreadable"
	// ReasonUnsupportedSelector: the target's pods are not selected by a
	// label set, which the private Service needs.
	ReasonUnsupportedSelector = "UnsupportedSelector"
)

// target is what a tick reads of the workload a PodAutoscaler scales.
//
// A Deployment is read from the manager's cache, as it always was: the
// cache holds every Deployment (trimmed, see cachetrim), and the
// Deployment tells more than its /scale (its ready pods, its progress
// deadline and conditions, its pod template's autoscaling annotations).
// Any other kind is read through its /scale subresource, one GET to the
// API server per tick (every 2 s) of each such target, and its ready
// pods are the ready endpoints of the private Service, which selects them
// by the /scale's selector (the cached EndpointSlices: no further read).
// Watching the other kinds instead would cache every object of each kind
// in the cluster, where a few of them are targets (docs/autoscaling.md,
// "Scale targets").
type target struct {
	gvk  schema.GroupVersionKind
	name string
	// replicas is the count the target is scaled to (spec.replicas);
	// ready how many of its pods are ready.
	replicas, ready int32
	// selector selects its pods (the private Service's selector).
	selector map[string]string
	// template holds the pod template's annotations (per-target
	// settings); nil for other kinds than Deployment.
	template map[string]string
	// progressDeadline is how long it may take to make progress: the
	// Deployment's, Kubernetes' default 600 s for other kinds.
	progressDeadline time.Duration
	// failing says why it wants pods and will not get one ("": it may):
	// read from a Deployment's conditions only.
	failing string
	// deployment is the Deployment (nil for other kinds), scaled by its
	// own /scale read at the time; scale is another kind's /scale as this
	// tick read it, written back with the new count (its resourceVersion
	// makes a change since a conflict).
	deployment *appsv1.Deployment
	scale      *autoscalingv1.Scale
}

// String names the target as messages do: Deployment "hello".
func (t *target) String() string { return fmt.Sprintf("%s %q", t.gvk.Kind, t.name) }

// deploymentTarget is a Deployment's target.
func deploymentTarget(d *appsv1.Deployment) *target {
	t := &target{gvk: appsv1.SchemeGroupVersion.WithKind("Deployment"), name: d.Name, replicas: 1, ready: d.Status.ReadyReplicas,
		template: d.Spec.Template.Annotations, progressDeadline: progressDeadline(d), failing: failing(d), deployment: d}
	if d.Spec.Selector != nil {
		t.selector = d.Spec.Selector.MatchLabels
	}
	if d.Spec.Replicas != nil {
		t.replicas = *d.Spec.Replicas
	}
	return t
}

// target returns what to scale, or why there is nothing (a reason and
// message of the Ready condition).
func (r *PodAutoscaler) target(ctx context.Context, pa *v1alpha1.PodAutoscaler) (*target, string, string) {
	ref := pa.Spec.ScaleTargetRef
	gvk, err := scaletarget.GroupVersionKind(ref)
	if err != nil {
		return nil, ReasonUnsupportedScaleTarget, err.Error()
	}
	if !r.ScaleTargetKinds.Allows(gvk.GroupKind()) {
		return nil, ReasonScaleTargetNotAllowed, fmt.Sprintf("scaleTargetRef %s %s: this cluster lets PodAutoscalers scale only %s (the controller's --scale-target-kinds, chart value controller.scaleTargets)",
			ref.APIVersion, ref.Kind, r.ScaleTargetKinds)
	}
	if gvk == appsv1.SchemeGroupVersion.WithKind("Deployment") {
		return r.deployment(ctx, pa)
	}
	sc, err := scaletarget.Get(ctx, r.Client, gvk, pa.Namespace, ref.Name)
	switch {
	case meta.IsNoMatchError(err):
		return nil, ReasonUnsupportedScaleTarget, fmt.Sprintf("scaleTargetRef %s %s: the API server serves no such kind", ref.APIVersion, ref.Kind)
	case apierrors.IsNotFound(err):
		reason, msg := r.notFound(gvk, pa)
		return nil, reason, msg
	case apierrors.IsForbidden(err):
		return nil, ReasonScaleTargetForbidden, fmt.Sprintf("the controller may not read the /scale of %s %q: its ClusterRole must grant get and update on the kind's scale subresource (chart value controller.scaleTargets): %v",
			ref.Kind, ref.Name, err)
	case err != nil:
		return nil, ReasonScaleTargetUnreadable, fmt.Sprintf("get the /scale of %s %q: %v", ref.Kind, ref.Name, err)
	}
	selector, err := scaletarget.Selector(sc.Status.Selector)
	if err != nil {
		return nil, ReasonUnsupportedSelector, fmt.Sprintf("%s %q: %v", ref.Kind, ref.Name, err)
	}
	ready, err := collect.ReadyPods(ctx, r.Client, pa.Namespace, names.PrivateServiceName(pa.Spec.Service.Name))
	if err != nil {
		return nil, ReasonScaleTargetUnreadable, fmt.Sprintf("count the ready pods of %s %q: %v", ref.Kind, ref.Name, err)
	}
	return &target{gvk: gvk, name: ref.Name, replicas: sc.Spec.Replicas, ready: int32(len(ready)), selector: selector,
		progressDeadline: defaultProgressDeadline, scale: sc}, "", ""
}

// deployment is the target of a PodAutoscaler of a Deployment, read from
// the cache.
func (r *PodAutoscaler) deployment(ctx context.Context, pa *v1alpha1.PodAutoscaler) (*target, string, string) {
	name := pa.Spec.ScaleTargetRef.Name
	var d appsv1.Deployment
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: pa.Namespace, Name: name}, &d); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, ReasonScaleTargetNotFound, fmt.Sprintf("Deployment %q does not exist in namespace %q", name, pa.Namespace)
		}
		return nil, ReasonScaleTargetUnreadable, err.Error()
	}
	if d.Spec.Selector == nil || len(d.Spec.Selector.MatchLabels) == 0 || len(d.Spec.Selector.MatchExpressions) > 0 {
		return nil, ReasonUnsupportedSelector, fmt.Sprintf("Deployment %q: its selector must be matchLabels only, because the private Service selects the same pods", name)
	}
	return deploymentTarget(&d), "", ""
}

// notFound says why a /scale was not found: the object does not exist,
// or its kind has no /scale (the API server answers both with the same
// 404; its discovery document tells them apart). Without Discovery, or
// when it cannot be read, the message says both.
func (r *PodAutoscaler) notFound(gvk schema.GroupVersionKind, pa *v1alpha1.PodAutoscaler) (string, string) {
	ref := pa.Spec.ScaleTargetRef
	missing := fmt.Sprintf("%s %q does not exist in namespace %q", ref.Kind, ref.Name, pa.Namespace)
	if r.Discovery == nil {
		return ReasonScaleTargetNotFound, missing + ", or its kind has no /scale subresource"
	}
	has, err := scaletarget.HasScale(r.Discovery, r.Client.RESTMapper(), gvk)
	switch {
	case err != nil:
		return ReasonScaleTargetNotFound, fmt.Sprintf("%s, or its kind has no /scale subresource (%v)", missing, err)
	case !has:
		return ReasonUnsupportedScaleTarget, fmt.Sprintf("scaleTargetRef %s %s: the kind has no /scale subresource, so it cannot be scaled", ref.APIVersion, ref.Kind)
	}
	return ReasonScaleTargetNotFound, missing
}
