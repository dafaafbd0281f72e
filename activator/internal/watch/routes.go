package watch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/activator/internal/target"
)

// Route host names: a request that reaches the activator through an
// ingress or a gateway carries the host the user called (shop.example.com),
// not a Service's name, so the host names of Ingresses and Gateway API
// HTTPRoutes whose backend is a target's public Service resolve to it.
// Only routes in the target's own namespace count: a route elsewhere must
// not be able to send a host of its choosing to someone else's target.
// Wildcard host names (*.example.com) are left out: one host cannot be told
// apart from another under them. HTTPRoutes are watched only where the
// Gateway API is installed when the activator starts (unstructured, so the
// activator needs no Gateway API module).

// backendField indexes routes by the names of the Services they send to.
const backendField = "sockscale.backends"

// HTTPRouteGVK is the Gateway API's HTTPRoute (v1, GA since Gateway API 1.0).
var HTTPRouteGVK = schema.GroupVersionKind{Group: "gateway.networking.k8s.io", Version: "v1", Kind: "HTTPRoute"}

func newHTTPRoute() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(HTTPRouteGVK)
	return u
}

func newHTTPRouteList() *unstructured.UnstructuredList {
	u := &unstructured.UnstructuredList{}
	u.SetGroupVersionKind(HTTPRouteGVK.GroupVersion().WithKind("HTTPRouteList"))
	return u
}

// ingressBackends names the Services an Ingress sends to, with the hosts
// each is reached by (the default backend takes every host of the Ingress).
func ingressBackends(ing *networkingv1.Ingress) map[string][]string {
	out := map[string][]string{}
	var all []string
	for _, r := range ing.Spec.Rules {
		if r.Host != "" {
			all = append(all, r.Host)
		}
	}
	for _, r := range ing.Spec.Rules {
		if r.Host == "" || r.HTTP == nil {
			continue
		}
		for _, p := range r.HTTP.Paths {
			if s := p.Backend.Service; s != nil && s.Name != "" {
				out[s.Name] = append(out[s.Name], r.Host)
			}
		}
	}
	if b := ing.Spec.DefaultBackend; b != nil && b.Service != nil && b.Service.Name != "" {
		out[b.Service.Name] = append(out[b.Service.Name], all...)
	}
	return out
}

// routeBackends names the Services in the route's own namespace that an
// HTTPRoute sends to, each with the route's host names.
func routeBackends(u *unstructured.Unstructured) map[string][]string {
	hosts, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "hostnames")
	rules, _, _ := unstructured.NestedSlice(u.Object, "spec", "rules")
	out := map[string][]string{}
	for _, r := range rules {
		rule, ok := r.(map[string]any)
		if !ok {
			continue
		}
		refs, _, _ := unstructured.NestedSlice(rule, "backendRefs")
		for _, ref := range refs {
			m, ok := ref.(map[string]any)
			if !ok {
				continue
			}
			group, _, _ := unstructured.NestedString(m, "group")
			kind, _, _ := unstructured.NestedString(m, "kind")
			ns, _, _ := unstructured.NestedString(m, "namespace")
			name, _, _ := unstructured.NestedString(m, "name")
			// Defaults of a backendRef: the core group's Service, in the
			// route's namespace.
			if group != "" || (kind != "" && kind != "Service") || (ns != "" && ns != u.GetNamespace()) || name == "" {
				continue
			}
			out[name] = append(out[name], hosts...)
		}
	}
	return out
}

// backendKeys returns the index values of a route: its backends' names.
func backendKeys(backends map[string][]string) []string {
	keys := make([]string, 0, len(backends))
	for name := range backends {
		keys = append(keys, name)
	}
	slices.Sort(keys)
	return keys
}

// routeTargets maps a route event to the targets it may concern.
func routeTargets(o client.Object) []target.Key {
	var names []string
	switch r := o.(type) {
	case *networkingv1.Ingress:
		names = backendKeys(ingressBackends(r))
	case *unstructured.Unstructured:
		names = backendKeys(routeBackends(r))
	}
	keys := make([]target.Key, 0, len(names))
	for _, n := range names {
		keys = append(keys, target.Key{Namespace: o.GetNamespace(), Name: n})
	}
	return keys
}

// routeHosts lists the host names that routes give target k: exact names
// only, lower case, each once.
func (w *Watcher) routeHosts(ctx context.Context, r client.Reader, k target.Key) ([]string, error) {
	var hosts []string
	var ings networkingv1.IngressList
	if err := r.List(ctx, &ings, client.InNamespace(k.Namespace), client.MatchingFields{backendField: k.Name}); err != nil {
		return nil, fmt.Errorf("list Ingresses of %s: %w", k, err)
	}
	for i := range ings.Items {
		hosts = append(hosts, ingressBackends(&ings.Items[i])[k.Name]...)
	}
	if w.httpRoutes {
		routes := newHTTPRouteList()
		if err := r.List(ctx, routes, client.InNamespace(k.Namespace), client.MatchingFields{backendField: k.Name}); err != nil {
			return nil, fmt.Errorf("list HTTPRoutes of %s: %w", k, err)
		}
		for i := range routes.Items {
			hosts = append(hosts, routeBackends(&routes.Items[i])[k.Name]...)
		}
	}
	out := hosts[:0]
	for _, h := range hosts {
		h = strings.ToLower(strings.TrimSuffix(h, "."))
		if h == "" || strings.Contains(h, "*") {
			continue
		}
		out = append(out, h)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// httpRoutesServed says whether the API server serves HTTPRoutes: a
// missing kind is "not installed", any other error is an error.
func httpRoutesServed(mapper meta.RESTMapper) (bool, error) {
	_, err := mapper.RESTMapping(HTTPRouteGVK.GroupKind(), HTTPRouteGVK.Version)
	if err == nil {
		return true, nil
	}
	var noMatch *meta.NoKindMatchError
	if meta.IsNoMatchError(err) || errors.As(err, &noMatch) {
		return false, nil
	}
	return false, fmt.Errorf("look up %s: %w", HTTPRouteGVK, err)
}
