package route

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

// North-south traffic: where the Gateway API is installed and a Gateway
// is configured, each of a Route's addresses gets an HTTPRoute of the
// same name attached to that Gateway, whose weighted backendRefs are the
// split (one host name per HTTPRoute: <route>.<namespace>.<domain> and
// <tag>-<route>.<namespace>.<domain>). The gateway then splits per
// request, straight to the revisions' public Services. HTTPRoutes are
// written unstructured, so the controller needs no Gateway API module.

// HTTPRouteGVK is the Gateway API's HTTPRoute (v1).
var HTTPRouteGVK = schema.GroupVersionKind{Group: "gateway.networking.k8s.io", Version: "v1", Kind: "HTTPRoute"}

// TargetHeader is set on each backend's requests so that an activator in
// a revision's path (the revision at zero) knows the revision although
// the host names the Route.
const TargetHeader = "Sockscale-Target"

// NewHTTPRoute is an empty unstructured HTTPRoute.
func NewHTTPRoute() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(HTTPRouteGVK)
	return u
}

// HTTPRoutesServed says whether the API server serves HTTPRoutes: a
// missing kind is "not installed", any other error is an error.
func HTTPRoutesServed(mapper meta.RESTMapper) (bool, error) {
	_, err := mapper.RESTMapping(HTTPRouteGVK.GroupKind(), HTTPRouteGVK.Version)
	var noMatch *meta.NoKindMatchError
	switch {
	case err == nil:
		return true, nil
	case meta.IsNoMatchError(err) || errors.As(err, &noMatch):
		return false, nil
	}
	return false, fmt.Errorf("look up %s: %w", HTTPRouteGVK, err)
}

// Weights are the revisions an address leads to, with their weights, in
// the order of status.traffic: for the Route's own address every target
// with percent > 0 (summed per revision); for a tag's, the entries with
// that tag by percent, or its newest entry when they are all at 0 %
// (during a gradual rollout a tagged latest target is in pieces, oldest
// first, each with the tag). The node agents and the activators choose
// the same way.
func Weights(traffic []servingv1alpha1.TrafficTargetStatus, tag string) (revisions []string, weights map[string]int64) {
	weights = map[string]int64{}
	newest := ""
	for _, t := range traffic {
		if tag != "" {
			if t.Tag != tag {
				continue
			}
			newest = t.RevisionName
		}
		if t.Percent != nil && *t.Percent > 0 && t.RevisionName != "" {
			if _, seen := weights[t.RevisionName]; !seen {
				revisions = append(revisions, t.RevisionName)
			}
			weights[t.RevisionName] += *t.Percent
		}
	}
	if tag != "" && len(revisions) == 0 && newest != "" {
		return []string{newest}, map[string]int64{newest: 1}
	}
	return revisions, weights
}

// Summary is the split of the Route's own address in one line for
// kubectl get: "hello-00002=55%,hello-00001=45%".
func Summary(traffic []servingv1alpha1.TrafficTargetStatus) string {
	revisions, weights := Weights(traffic, "")
	parts := make([]string, len(revisions))
	for i, rev := range revisions {
		parts[i] = fmt.Sprintf("%s=%d%%", rev, weights[rev])
	}
	return strings.Join(parts, ",")
}

// host is an address's external host name.
func (r *Reconciler) host(rt *servingv1alpha1.Route, tag string) string {
	return fmt.Sprintf("%s.%s.%s", AddressName(rt.Name, tag), rt.Namespace, r.Domain)
}

// makeHTTPRoute is the HTTPRoute of one of rt's addresses.
func (r *Reconciler) makeHTTPRoute(rt *servingv1alpha1.Route, traffic []servingv1alpha1.TrafficTargetStatus, tag string) *unstructured.Unstructured {
	revisions, weights := Weights(traffic, tag)
	backends := make([]any, 0, len(revisions))
	for _, rev := range revisions {
		backends = append(backends, map[string]any{
			"group": "", "kind": "Service", "name": rev, "port": int64(AddressPort), "weight": weights[rev],
			"filters": []any{map[string]any{
				"type": "RequestHeaderModifier",
				"requestHeaderModifier": map[string]any{"set": []any{
					map[string]any{"name": TargetHeader, "value": rt.Namespace + "/" + rev},
				}},
			}},
		})
	}
	u := NewHTTPRoute()
	u.SetNamespace(rt.Namespace)
	u.SetName(AddressName(rt.Name, tag))
	labels := map[string]string{servingv1alpha1.RouteLabelKey: rt.Name}
	if tag != "" {
		labels[servingv1alpha1.TagLabelKey] = tag
	}
	u.SetLabels(labels)
	u.Object["spec"] = map[string]any{
		"parentRefs": []any{map[string]any{"group": HTTPRouteGVK.Group, "kind": "Gateway", "namespace": r.Gateway.Namespace, "name": r.Gateway.Name}},
		"hostnames":  []any{r.host(rt, tag)},
		"rules":      []any{map[string]any{"backendRefs": backends}},
	}
	return u
}

// ensureHTTPRoutes keeps one HTTPRoute per address of the split in
// effect (tags as given) and removes those of tags gone. It returns a
// problem when a name belongs to someone else or the API server refuses
// one.
func (r *Reconciler) ensureHTTPRoutes(ctx context.Context, rt *servingv1alpha1.Route, traffic []servingv1alpha1.TrafficTargetStatus, tags []string) (*problem, error) {
	var first *problem
	keep := map[string]bool{}
	for _, tag := range append([]string{""}, tags...) {
		want := r.makeHTTPRoute(rt, traffic, tag)
		keep[want.GetName()] = true
		p, err := r.ensureHTTPRoute(ctx, rt, want)
		if err != nil {
			return nil, err
		}
		first = firstOf(first, p)
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(HTTPRouteGVK.GroupVersion().WithKind("HTTPRouteList"))
	if err := r.Client.List(ctx, list, client.InNamespace(rt.Namespace), client.MatchingLabels{servingv1alpha1.RouteLabelKey: rt.Name}); err != nil {
		return nil, fmt.Errorf("list the Route's HTTPRoutes: %w", err)
	}
	for i := range list.Items {
		h := &list.Items[i]
		if keep[h.GetName()] || !metav1.IsControlledBy(h, rt) {
			continue
		}
		if err := r.Client.Delete(ctx, h); client.IgnoreNotFound(err) != nil {
			return nil, fmt.Errorf("delete HTTPRoute %s of a removed tag: %w", h.GetName(), err)
		}
	}
	return first, nil
}

func (r *Reconciler) ensureHTTPRoute(ctx context.Context, rt *servingv1alpha1.Route, want *unstructured.Unstructured) (*problem, error) {
	have := NewHTTPRoute()
	err := r.Client.Get(ctx, types.NamespacedName{Namespace: want.GetNamespace(), Name: want.GetName()}, have)
	switch {
	case apierrors.IsNotFound(err):
		if err := controllerutil.SetControllerReference(rt, want, r.Client.Scheme()); err != nil {
			return nil, err
		}
		if err := r.Client.Create(ctx, want); err != nil && !apierrors.IsAlreadyExists(err) {
			if apierrors.IsInvalid(err) {
				return &problem{metav1.ConditionFalse, ReasonHTTPRouteInvalid, fmt.Sprintf("the API server refused HTTPRoute %q: %v", want.GetName(), err)}, nil
			}
			return nil, fmt.Errorf("create HTTPRoute %s: %w", want.GetName(), err)
		}
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("get HTTPRoute %s: %w", want.GetName(), err)
	case !metav1.IsControlledBy(have, rt):
		return &problem{metav1.ConditionFalse, ReasonNotOwned,
			fmt.Sprintf("HTTPRoute %q exists and does not belong to this Route: delete or rename it so the Route can use its host name", want.GetName())}, nil
	}
	labels := have.GetLabels()
	if equality.Semantic.DeepEqual(have.Object["spec"], want.Object["spec"]) && labelsHold(labels, want.GetLabels()) {
		return nil, nil
	}
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, want.GetLabels())
	have.SetLabels(labels)
	have.Object["spec"] = want.Object["spec"]
	if err := r.Client.Update(ctx, have); err != nil {
		if apierrors.IsInvalid(err) {
			return &problem{metav1.ConditionFalse, ReasonHTTPRouteInvalid, fmt.Sprintf("the API server refused HTTPRoute %q: %v", want.GetName(), err)}, nil
		}
		return nil, fmt.Errorf("update HTTPRoute %s: %w", want.GetName(), err)
	}
	return nil, nil
}

// externalURLs gives the Route and its tags their external URLs.
func (r *Reconciler) externalURLs(rt *servingv1alpha1.Route, s *servingv1alpha1.RouteStatus) {
	s.URL = "http://" + r.host(rt, "")
	for i := range s.Traffic {
		if tag := s.Traffic[i].Tag; tag != "" {
			s.Traffic[i].URL = "http://" + r.host(rt, tag)
		}
	}
}
