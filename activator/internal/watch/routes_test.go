package watch

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/activator/internal/target"
)

// Parent statuses of an HTTPRoute, as a Gateway's controller writes them.
var (
	acceptedNow = []any{parentStatus("True", 2)}
	acceptedAny = []any{parentStatus("True", 0)} // no observedGeneration
	rejected    = []any{parentStatus("False", 2)}
	staleAccept = []any{parentStatus("True", 1)} // accepted before the last edit
	oneOfTwo    = []any{parentStatus("False", 2), parentStatus("True", 2)}
	notAccepted = []any{map[string]any{"parentRef": map[string]any{"name": "gw"}, "conditions": []any{
		map[string]any{"type": "ResolvedRefs", "status": "True", "observedGeneration": int64(2)}}}}
)

func parentStatus(accepted string, gen int64) map[string]any {
	c := map[string]any{"type": "Accepted", "status": accepted, "reason": "Test"}
	if gen != 0 {
		c["observedGeneration"] = gen
	}
	return map[string]any{"parentRef": map[string]any{"name": "gw", "namespace": "infra"}, "controllerName": "example.com/gateway", "conditions": []any{c}}
}

// httpRoute is an HTTPRoute of generation 2 with the given host names and
// backends (Services of its namespace); parents nil: no status.
func httpRoute(ns, name string, created int64, parents []any, hosts []string, backends ...string) *unstructured.Unstructured {
	u := newHTTPRoute()
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetGeneration(2)
	u.SetCreationTimestamp(metav1.Unix(created, 0))
	var hs, refs []any
	for _, h := range hosts {
		hs = append(hs, h)
	}
	for _, b := range backends {
		refs = append(refs, map[string]any{"name": b, "port": int64(80)})
	}
	u.Object["spec"] = map[string]any{"hostnames": hs, "rules": []any{map[string]any{"backendRefs": refs}}}
	if parents != nil {
		u.Object["status"] = map[string]any{"parents": parents}
	}
	return u
}

// ingressIn is an Ingress of namespace ns created at second created.
func ingressIn(ns, name string, created int64, rules ...networkingv1.IngressRule) *networkingv1.Ingress {
	ing := ingress(name, "", rules...)
	ing.Namespace = ns
	ing.CreationTimestamp = metav1.Unix(created, 0)
	return ing
}

// TestHTTPRouteHostsOnlyWhenAttached: an HTTPRoute's host names count
// only while a Gateway accepts it (some parent with Accepted True, for
// its current generation when the condition says which); an Ingress, with
// no such status, counts as written.
func TestHTTPRouteHostsOnlyWhenAttached(t *testing.T) {
	tests := []struct {
		name    string
		parents []any
		want    []string
	}{
		{name: "no status: no Gateway took it", parents: nil, want: nil},
		{name: "Accepted True", parents: acceptedNow, want: []string{"shop.example.com"}},
		{name: "Accepted True, no observedGeneration", parents: acceptedAny, want: []string{"shop.example.com"}},
		{name: "Accepted False", parents: rejected, want: nil},
		{name: "Accepted True of an older generation", parents: staleAccept, want: nil},
		{name: "one Gateway refuses, another accepts", parents: oneOfTwo, want: []string{"shop.example.com"}},
		{name: "other conditions only", parents: notAccepted, want: nil},
		{name: "malformed parents", parents: []any{"gw", map[string]any{"conditions": "Accepted"}}, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := []client.Object{
				pa("hello", "hello", 1), service("hello", corev1.ServicePort{Port: 80}),
				httpRoute("team", "shop", 1, tt.parents, []string{"shop.example.com"}, "hello"),
				ingress("www", "", rule("www.example.com", "hello")),
			}
			s := newSinks()
			w := watcher(s)
			w.httpRoutes = true
			if err := w.Sync(context.Background(), reader(t, objs...), hello); err != nil {
				t.Fatal(err)
			}
			want := append([]string{"www.example.com"}, tt.want...)
			if diff := cmp.Diff(want, s.targets[hello].Hosts, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
				t.Errorf("hosts (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRouteHostConflicts: when routes of different namespaces claim one
// exact host, the oldest route (then namespace/name) owns it; a claim of
// another namespace is ignored, whatever its age relative to the
// target's own other routes. Target team/hello's routes are in "team".
func TestRouteHostConflicts(t *testing.T) {
	shop := func(ns, name string, created int64, backend string) *networkingv1.Ingress {
		return ingressIn(ns, name, created, rule("shop.example.com", backend))
	}
	teamShop := refOf(shop("team", "shop", 10, "hello"))
	tests := []struct {
		name      string
		routes    []client.Object
		wantHosts []string
		want      []hostConflict
	}{
		{name: "alone", routes: []client.Object{shop("team", "shop", 10, "hello")}, wantHosts: []string{"shop.example.com"}},
		{name: "a newer route elsewhere takes nothing",
			routes:    []client.Object{shop("team", "shop", 10, "hello"), shop("other", "shop", 20, "web")},
			wantHosts: []string{"shop.example.com"}},
		{name: "an older route elsewhere owns the host",
			routes: []client.Object{shop("team", "shop", 10, "hello"), shop("other", "shop", 5, "web")},
			want:   []hostConflict{{Host: "shop.example.com", Route: teamShop, Owner: refOf(shop("other", "shop", 5, "web"))}}},
		{name: "same second: namespace/name alphabetically",
			routes: []client.Object{shop("team", "shop", 10, "hello"), shop("other", "zzz", 10, "web")},
			want:   []hostConflict{{Host: "shop.example.com", Route: teamShop, Owner: refOf(shop("other", "zzz", 10, "web"))}}},
		{name: "same second, the target's namespace first alphabetically",
			routes:    []client.Object{shop("team", "shop", 10, "hello"), shop("zz-team", "aaa", 10, "web")},
			wantHosts: []string{"shop.example.com"}},
		{name: "an older route elsewhere with no backend still owns it (the Gateway API orders routes, not backends)",
			routes: []client.Object{shop("team", "shop", 10, "hello"), ingressIn("other", "parked", 1, rule("shop.example.com"))},
			want:   []hostConflict{{Host: "shop.example.com", Route: teamShop, Owner: refOf(ingressIn("other", "parked", 1, rule("shop.example.com")))}}},
		{name: "an older HTTPRoute elsewhere, not attached: no claim",
			routes:    []client.Object{shop("team", "shop", 10, "hello"), httpRoute("other", "shop", 1, rejected, []string{"shop.example.com"}, "web")},
			wantHosts: []string{"shop.example.com"}},
		{name: "an older HTTPRoute elsewhere, attached",
			routes: []client.Object{shop("team", "shop", 10, "hello"), httpRoute("other", "shop", 1, acceptedNow, []string{"SHOP.example.com."}, "web")},
			want:   []hostConflict{{Host: "shop.example.com", Route: teamShop, Owner: refOf(httpRoute("other", "shop", 1, nil, nil))}}},
		{name: "an older wildcard elsewhere claims no exact host",
			routes:    []client.Object{shop("team", "shop", 10, "hello"), httpRoute("other", "all", 1, acceptedNow, []string{"*.example.com"}, "web")},
			wantHosts: []string{"shop.example.com"}},
		{name: "an older route of the target's own namespace to another Service: the namespace owns the host",
			routes:    []client.Object{shop("team", "shop", 10, "hello"), shop("team", "cart", 1, "cart"), shop("other", "shop", 5, "web")},
			wantHosts: []string{"shop.example.com"}},
		{name: "the target's Ingress and HTTPRoute both lose; its other host stays",
			routes: []client.Object{
				ingressIn("team", "shop", 10, rule("shop.example.com", "hello"), rule("www.example.com", "hello")),
				httpRoute("team", "shop", 11, acceptedNow, []string{"shop.example.com"}, "hello"),
				shop("other", "shop", 5, "web"),
			},
			wantHosts: []string{"www.example.com"},
			want: []hostConflict{
				{Host: "shop.example.com", Route: teamShop, Owner: refOf(shop("other", "shop", 5, "web"))},
				{Host: "shop.example.com", Route: refOf(httpRoute("team", "shop", 11, nil, nil)), Owner: refOf(shop("other", "shop", 5, "web"))},
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs := append([]client.Object{pa("hello", "hello", 1), service("hello", corev1.ServicePort{Port: 80})}, tt.routes...)
			s := newSinks()
			w := watcher(s)
			w.httpRoutes = true
			hosts, conflicts, err := w.routeHosts(context.Background(), reader(t, objs...), hello)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.wantHosts, hosts, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("hosts (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.want, conflicts, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("conflicts (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRouteHostConflictLoggedOnceAndCounted: an ignored claim is logged
// once, naming both routes, however often its target is synced, and
// counted while it lasts; when the owner goes, the host comes back and
// the gauge to 0.
func TestRouteHostConflictLoggedOnceAndCounted(t *testing.T) {
	older := ingressIn("other", "shop", 5, rule("shop.example.com", "web"))
	objs := []client.Object{pa("hello", "hello", 1), service("hello", corev1.ServicePort{Port: 80}),
		ingressIn("team", "shop", 10, rule("shop.example.com", "hello")), older}
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	s := newSinks()
	w := watcher(s)
	w.Log = slog.New(slog.NewTextHandler(&logs, nil))
	w.Registerer = reg
	for range 3 {
		if err := w.Sync(context.Background(), reader(t, objs...), hello); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "an older route of another namespace claims it"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, logs.String())
	}
	for _, want := range []string{`host=shop.example.com`, `route="Ingress team/shop"`, `ownedBy="Ingress other/shop"`, `target=team/hello`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %s:\n%s", want, logs.String())
		}
	}
	if len(s.targets[hello].Hosts) != 0 {
		t.Errorf("hosts %q, want none: shop.example.com is other's", s.targets[hello].Hosts)
	}
	gauge := func() float64 {
		return testutil.ToFloat64(w.claims().gauge)
	}
	if got := gauge(); got != 1 {
		t.Errorf("sockscale_activator_route_host_conflicts = %v, want 1", got)
	}
	if n, err := testutil.GatherAndCount(reg, "sockscale_activator_route_host_conflicts"); err != nil || n != 1 {
		t.Errorf("registered series: %d, %v; want 1", n, err)
	}

	// The older route goes: the host is the target's again.
	if err := w.Sync(context.Background(), reader(t, objs[:3]...), hello); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"shop.example.com"}, s.targets[hello].Hosts); diff != "" {
		t.Errorf("hosts after the owner went (-want +got):\n%s", diff)
	}
	if got := gauge(); got != 0 {
		t.Errorf("sockscale_activator_route_host_conflicts = %v after the owner went, want 0", got)
	}

	// Back in conflict, then the target goes: its conflicts go with it.
	if err := w.Sync(context.Background(), reader(t, objs...), hello); err != nil {
		t.Fatal(err)
	}
	if err := w.Sync(context.Background(), reader(t, older), hello); err != nil {
		t.Fatal(err)
	}
	if got := gauge(); got != 0 {
		t.Errorf("sockscale_activator_route_host_conflicts = %v after the target went, want 0", got)
	}
}

// TestRouteEventTargets: a route's event concerns the targets it sends
// to and those of every route, of any namespace, claiming one of its
// hosts: deleting an older route elsewhere must give the host back.
func TestRouteEventTargets(t *testing.T) {
	objs := []client.Object{
		ingressIn("team", "shop", 10, rule("shop.example.com", "hello")),
		httpRoute("team-b", "shop", 20, acceptedNow, []string{"shop.example.com"}, "web"),
		httpRoute("team-c", "shop", 30, rejected, []string{"shop.example.com"}, "api"), // claims nothing
		ingressIn("team-d", "www", 1, rule("www.example.com", "site")),                 // another host
	}
	w := watcher(newSinks())
	w.httpRoutes = true
	// The event of a route that is gone from the cache already.
	gone := ingressIn("other", "shop", 5, rule("shop.example.com", "web"), rule("www.example.com"))
	got := w.routeEventTargets(context.Background(), reader(t, objs...), gone)
	want := []target.Key{{Namespace: "other", Name: "web"}, hello, {Namespace: "team-b", Name: "web"}, {Namespace: "team-d", Name: "site"}}
	if diff := cmp.Diff(want, got, cmpopts.SortSlices(func(a, b target.Key) bool { return a.String() < b.String() })); diff != "" {
		t.Errorf("targets (-want +got):\n%s", diff)
	}
}
