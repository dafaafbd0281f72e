package watch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/activator/internal/target"
)

// Route host names: a request that reaches the activator through an
// ingress or a gateway carries the host the user called (shop.example.com),
// not a Service's name, so the host names of Ingresses and Gateway API
// HTTPRoutes whose backend is a target's public Service resolve to it.
// Routes are any tenant's objects, so a host name counts only under rules
// that no other tenant's objects can bend:
//
//   - Only routes in the target's own namespace give it host names: a
//     route elsewhere must not send a host of its choosing to someone
//     else's target.
//   - An HTTPRoute claims its host names only while it is attached: some
//     entry of status.parents has condition Accepted True (for the
//     route's current generation, when the condition says which), which
//     only a Gateway's controller writes. A route no Gateway took sends
//     no traffic, and must not reserve a host either. An Ingress has no
//     such status: it claims its hosts as written.
//   - Routes of different namespaces claiming one exact host name: the
//     oldest route (creationTimestamp, then "namespace/name"
//     alphabetically), as the Gateway API orders conflicting routes, owns
//     it; the other namespaces' claims of it are ignored (logged once,
//     counted in sockscale_activator_route_host_conflicts). A newer route
//     can never take a host from another namespace. Several routes of the
//     owner's namespace all count: a host that leads to two of its
//     targets is ambiguous, the namespace's own affair.
//
// Wildcard host names (*.example.com) are left out: one host cannot be told
// apart from another under them. HTTPRoutes are watched only where the
// Gateway API is installed when the activator starts (unstructured, so the
// activator needs no Gateway API module).

// Field indexes of routes: by the names of the Services they send to, and
// by the exact host names they claim (routeClaims).
const (
	backendField = "sockscale.backends"
	hostField    = "sockscale.hosts"
)

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

// routeTargets maps a route to the targets it sends to, in its namespace.
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

// exactHost is h as hosts are compared (lower case, no trailing dot), or
// "" when h names no one host: empty, a wildcard, or no host name at all
// (".." is "." without its trailing dot; the API server refuses such
// hosts in Ingresses and HTTPRoutes, but a host is never taken on trust).
func exactHost(h string) string {
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	if strings.Contains(h, "*") || len(validation.IsDNS1123Subdomain(h)) > 0 {
		return ""
	}
	return h
}

// routeClaims lists the exact host names a route claims, each once: every
// rule host of an Ingress; the host names of an HTTPRoute, if attached.
func routeClaims(o client.Object) []string {
	var hosts []string
	switch r := o.(type) {
	case *networkingv1.Ingress:
		for _, rule := range r.Spec.Rules {
			hosts = append(hosts, rule.Host)
		}
	case *unstructured.Unstructured:
		if attached(r) {
			hosts, _, _ = unstructured.NestedStringSlice(r.Object, "spec", "hostnames")
		}
	}
	out := make([]string, 0, len(hosts))
	for _, h := range hosts {
		if h = exactHost(h); h != "" {
			out = append(out, h)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// attached says whether a Gateway took the HTTPRoute: some entry of
// status.parents has condition Accepted True. A condition that names the
// generation it was written for must name the route's current one: an
// older acceptance may predate the host names written now.
func attached(u *unstructured.Unstructured) bool {
	parents, _, _ := unstructured.NestedSlice(u.Object, "status", "parents")
	for _, p := range parents {
		parent, ok := p.(map[string]any)
		if !ok {
			continue
		}
		conds, _, _ := unstructured.NestedSlice(parent, "conditions")
		for _, c := range conds {
			cond, ok := c.(map[string]any)
			if !ok {
				continue
			}
			typ, _, _ := unstructured.NestedString(cond, "type")
			status, _, _ := unstructured.NestedString(cond, "status")
			gen, _, _ := unstructured.NestedInt64(cond, "observedGeneration")
			if typ == "Accepted" && status == "True" && (gen == 0 || gen == u.GetGeneration()) {
				return true
			}
		}
	}
	return false
}

// routeRef names a route in logs and orders routes for the conflict rule.
type routeRef struct {
	Kind, Namespace, Name string
	Created               time.Time
}

func refOf(o client.Object) routeRef {
	kind := "Ingress"
	if _, ok := o.(*unstructured.Unstructured); ok {
		kind = HTTPRouteGVK.Kind
	}
	return routeRef{Kind: kind, Namespace: o.GetNamespace(), Name: o.GetName(), Created: o.GetCreationTimestamp().UTC()}
}

func (r routeRef) String() string { return r.Kind + " " + r.Namespace + "/" + r.Name }

// compare orders routes as the Gateway API orders conflicting ones: the
// oldest creationTimestamp first, then "namespace/name" alphabetically;
// the kind last, so that an Ingress and an HTTPRoute of one name and
// second are ordered too.
func (r routeRef) compare(o routeRef) int {
	if c := r.Created.Compare(o.Created); c != 0 {
		return c
	}
	if c := strings.Compare(r.Namespace+"/"+r.Name, o.Namespace+"/"+o.Name); c != 0 {
		return c
	}
	return strings.Compare(r.Kind, o.Kind)
}

// hostConflict is a claim ignored: Route, of the target's namespace,
// claims Host, which Owner, an older route of another namespace, owns.
type hostConflict struct {
	Host         string
	Route, Owner routeRef
}

// claimants lists the routes of every namespace that claim host, from r.
// The index narrows the list; each route is checked again, so a reader
// that ignores the field selector gives the same answer.
func (w *Watcher) claimants(ctx context.Context, r client.Reader, host string) ([]client.Object, error) {
	var out []client.Object
	var ings networkingv1.IngressList
	if err := r.List(ctx, &ings, client.MatchingFields{hostField: host}); err != nil {
		return nil, fmt.Errorf("list Ingresses claiming host %q: %w", host, err)
	}
	for i := range ings.Items {
		if slices.Contains(routeClaims(&ings.Items[i]), host) {
			out = append(out, &ings.Items[i])
		}
	}
	if w.httpRoutes {
		routes := newHTTPRouteList()
		if err := r.List(ctx, routes, client.MatchingFields{hostField: host}); err != nil {
			return nil, fmt.Errorf("list HTTPRoutes claiming host %q: %w", host, err)
		}
		for i := range routes.Items {
			if slices.Contains(routeClaims(&routes.Items[i]), host) {
				out = append(out, &routes.Items[i])
			}
		}
	}
	return out, nil
}

// hostOwner is the oldest route of any namespace claiming host; false
// when none does.
func (w *Watcher) hostOwner(ctx context.Context, r client.Reader, host string) (routeRef, bool, error) {
	objs, err := w.claimants(ctx, r, host)
	if err != nil || len(objs) == 0 {
		return routeRef{}, false, err
	}
	owner := refOf(objs[0])
	for _, o := range objs[1:] {
		if ref := refOf(o); ref.compare(owner) < 0 {
			owner = ref
		}
	}
	return owner, true, nil
}

// routeHosts lists the host names that routes give target k (exact names
// only, lower case, each once, sorted), and the claims of its routes that
// an older route of another namespace overrides.
func (w *Watcher) routeHosts(ctx context.Context, r client.Reader, k target.Key) ([]string, []hostConflict, error) {
	// host -> the routes of k's namespace that give it to k.
	claims := map[string][]routeRef{}
	add := func(o client.Object, hosts []string) {
		claimed := routeClaims(o)
		for _, h := range hosts {
			if h = exactHost(h); h != "" && slices.Contains(claimed, h) {
				claims[h] = append(claims[h], refOf(o))
			}
		}
	}
	var ings networkingv1.IngressList
	if err := r.List(ctx, &ings, client.InNamespace(k.Namespace), client.MatchingFields{backendField: k.Name}); err != nil {
		return nil, nil, fmt.Errorf("list Ingresses of %s: %w", k, err)
	}
	for i := range ings.Items {
		add(&ings.Items[i], ingressBackends(&ings.Items[i])[k.Name])
	}
	if w.httpRoutes {
		routes := newHTTPRouteList()
		if err := r.List(ctx, routes, client.InNamespace(k.Namespace), client.MatchingFields{backendField: k.Name}); err != nil {
			return nil, nil, fmt.Errorf("list HTTPRoutes of %s: %w", k, err)
		}
		for i := range routes.Items {
			add(&routes.Items[i], routeBackends(&routes.Items[i])[k.Name])
		}
	}
	var hosts []string
	var conflicts []hostConflict
	for h, refs := range claims {
		owner, ok, err := w.hostOwner(ctx, r, h)
		if err != nil {
			return nil, nil, err
		}
		if !ok || owner.Namespace == k.Namespace {
			hosts = append(hosts, h)
			continue
		}
		for _, ref := range refs {
			c := hostConflict{Host: h, Route: ref, Owner: owner}
			if !slices.Contains(conflicts, c) {
				conflicts = append(conflicts, c)
			}
		}
	}
	slices.Sort(hosts)
	slices.SortFunc(conflicts, func(a, b hostConflict) int {
		if c := strings.Compare(a.Host, b.Host); c != 0 {
			return c
		}
		return a.Route.compare(b.Route)
	})
	return hosts, conflicts, nil
}

// routeEventTargets maps an Ingress or HTTPRoute event to the targets it
// may concern: those it sends to, and those of every route, of any
// namespace, claiming one of its hosts (which route owns a host may
// change with this one). The cache (r) has the object's new state when
// the event arrives, so a deleted route is no claimant any more.
func (w *Watcher) routeEventTargets(ctx context.Context, r client.Reader, o client.Object) []target.Key {
	keys := routeTargets(o)
	for _, h := range routeClaims(o) {
		others, err := w.claimants(ctx, r, h)
		if err != nil {
			// The cache answers from memory; an error is a missing index,
			// a bug worth a loud log rather than a silent stale claim.
			w.Log.Error("route event: claimants of a host not listed", "host", h, "route", refOf(o).String(), "error", err)
			continue
		}
		for _, other := range others {
			keys = append(keys, routeTargets(other)...)
		}
	}
	return keys
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
