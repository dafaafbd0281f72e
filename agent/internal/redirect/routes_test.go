package redirect

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	bpfredirect "github.com/sockscale/sockscale/bpf/redirect"
)

// routeBuilder makes Routes for tests: rt("hello").Split("hello-00001",
// 30).Split("hello-00002", 70).Obj() has that split in effect.
type routeBuilder struct{ r servingv1alpha1.Route }

func rt(name string) *routeBuilder {
	return &routeBuilder{servingv1alpha1.Route{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}}
}

// Split adds a target of status.traffic with this percent.
func (b *routeBuilder) Split(revision string, percent int64) *routeBuilder {
	return b.Tagged("", revision, percent)
}

// Tagged adds a tagged target of status.traffic with this percent.
func (b *routeBuilder) Tagged(tag, revision string, percent int64) *routeBuilder {
	b.r.Status.Traffic = append(b.r.Status.Traffic, servingv1alpha1.TrafficTargetStatus{Tag: tag, RevisionName: revision, Percent: &percent})
	return b
}

// Unset adds a target without a percent.
func (b *routeBuilder) Unset(revision string) *routeBuilder {
	b.r.Status.Traffic = append(b.r.Status.Traffic, servingv1alpha1.TrafficTargetStatus{RevisionName: revision})
	return b
}

func (b *routeBuilder) Obj() servingv1alpha1.Route { return *b.r.DeepCopy() }

// routeService makes a Route's Kubernetes Service as the controller does:
// <route> for its own address, <tag>-<route> for a tag's, with the labels.
func routeService(route, tag string, clusterIPs []string, ports ...string) *corev1.Service {
	name := route
	if tag != "" {
		name = tag + "-" + route
	}
	s := service(name, clusterIPs, ports...)
	s.Labels = map[string]string{servingv1alpha1.RouteLabelKey: route}
	if tag != "" {
		s.Labels[servingv1alpha1.TagLabelKey] = tag
	}
	return s
}

// named names a test Service's ports, in order.
func named(s *corev1.Service, names ...string) *corev1.Service {
	for i, n := range names {
		s.Spec.Ports[i].Name = n
	}
	return s
}

func weighted(addr string, w uint32) bpfredirect.Backend {
	return bpfredirect.Backend{Addr: ap(addr), Weight: w}
}

var (
	helloRoute = Target{Kind: KindRoute, NamespacedName: hello}
	canaryTag  = Target{Kind: KindTag, NamespacedName: hello, Tag: "canary"}
	ip         = func(s string) []string { return []string{s} }
	routeSvc   = routeService("hello", "", ip("10.96.0.50"), "80")
	canarySvc  = routeService("hello", "canary", ip("10.96.0.51"), "80")
	rev1, rev2 = service("hello-00001", ip("10.96.0.11"), "80"), service("hello-00002", ip("10.96.0.12"), "80")
	routeAddr  = ap("10.96.0.50:80")
	canaryAddr = ap("10.96.0.51:80")
	rev2SKS    = sksTarget(types.NamespacedName{Namespace: "default", Name: "hello-00002"})
)

func TestComputeRoutes(t *testing.T) {
	tests := []struct {
		name        string
		routes      []servingv1alpha1.Route
		routeSvcs   []*corev1.Service
		svcs        []*corev1.Service
		skses       []v1alpha1.ServerlessService
		unavailable bool
		wantEntries map[netip.AddrPort][]bpfredirect.Backend
		wantSkipped map[Target]string
		// wantTargets: the targets of the Route Services' addresses (nil:
		// 10.96.0.50:80 the Route's, 10.96.0.51:80 canary's).
		wantTargets map[netip.AddrPort]Target
	}{{
		name:      "a split 30/70 and a tag: weights are the percents, the tag's one backend",
		routes:    []servingv1alpha1.Route{rt("hello").Split("hello-00001", 30).Tagged("canary", "hello-00002", 70).Obj()},
		routeSvcs: []*corev1.Service{routeSvc, canarySvc},
		svcs:      []*corev1.Service{rev2, rev1},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{
			routeAddr:  {weighted("10.96.0.11:80", 30), weighted("10.96.0.12:80", 70)},
			canaryAddr: {weighted("10.96.0.12:80", 70)},
		},
	}, {
		name: "a tagged target in a gradual rollout (pieces oldest first, each with the tag): the tag follows the same shares",
		routes: []servingv1alpha1.Route{rt("hello").Tagged("canary", "hello-00001", 54).Tagged("canary", "hello-00002", 1).
			Split("hello-00001", 45).Obj()},
		routeSvcs: []*corev1.Service{routeSvc, canarySvc},
		svcs:      []*corev1.Service{rev1, rev2},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{
			routeAddr:  {weighted("10.96.0.11:80", 99), weighted("10.96.0.12:80", 1)},
			canaryAddr: {weighted("10.96.0.11:80", 54), weighted("10.96.0.12:80", 1)},
		},
	}, {
		name:      "a tagged target at 0 % in pieces: the tag goes to its newest",
		routes:    []servingv1alpha1.Route{rt("hello").Tagged("canary", "hello-00001", 0).Tagged("canary", "hello-00002", 0).Split("hello-00001", 100).Obj()},
		routeSvcs: []*corev1.Service{routeSvc, canarySvc},
		svcs:      []*corev1.Service{rev1, rev2},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{
			routeAddr:  {weighted("10.96.0.11:80", 100)},
			canaryAddr: {weighted("10.96.0.12:80", 1)},
		},
	}, {
		name:      "two targets of one revision: their percents summed",
		routes:    []servingv1alpha1.Route{rt("hello").Split("hello-00002", 20).Split("hello-00001", 50).Split("hello-00002", 30).Obj()},
		routeSvcs: []*corev1.Service{routeSvc},
		svcs:      []*corev1.Service{rev1, rev2},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{
			routeAddr: {weighted("10.96.0.11:80", 50), weighted("10.96.0.12:80", 50)},
		},
		wantTargets: map[netip.AddrPort]Target{routeAddr: helloRoute},
	}, {
		name: "targets at 0 % or without percent are not in the split; a tag at 0 % has its address",
		routes: []servingv1alpha1.Route{rt("hello").Split("hello-00001", 100).Tagged("canary", "hello-00002", 0).
			Split("hello-00003", 0).Unset("hello-00004").Obj()},
		routeSvcs: []*corev1.Service{routeSvc, canarySvc},
		svcs:      []*corev1.Service{rev1, rev2}, // 00003 and 00004 have no Service: not needed
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{
			routeAddr:  {weighted("10.96.0.11:80", 100)},
			canaryAddr: {weighted("10.96.0.12:80", 1)},
		},
	}, {
		name:      "a revision in Proxy mode keeps its own entry: the kernel's second hop",
		routes:    []servingv1alpha1.Route{rt("hello").Split("hello-00001", 30).Split("hello-00002", 70).Obj()},
		routeSvcs: []*corev1.Service{routeSvc},
		svcs:      []*corev1.Service{rev1, rev2},
		skses:     []v1alpha1.ServerlessService{sks("hello-00002").Proxy("act-a").Obj()},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{
			routeAddr:           {weighted("10.96.0.11:80", 30), weighted("10.96.0.12:80", 70)},
			ap("10.96.0.12:80"): backends("10.0.0.1:8012"),
		},
		wantTargets: map[netip.AddrPort]Target{routeAddr: helloRoute, ap("10.96.0.12:80"): rev2SKS},
	}, {
		name:      "each port of the Route Service to the revision's port of its name, else its first TCP port",
		routes:    []servingv1alpha1.Route{rt("hello").Split("hello-00001", 50).Split("hello-00002", 50).Obj()},
		routeSvcs: []*corev1.Service{named(routeService("hello", "", ip("10.96.0.50"), "80", "81", "53/UDP"), "http", "grpc", "dns")},
		svcs: []*corev1.Service{
			named(service("hello-00001", ip("10.96.0.11"), "53/UDP", "9090", "8080", "8081"), "grpc", "metrics", "http", "grpc-tcp"),
			named(service("hello-00002", ip("10.96.0.12"), "80"), "h2c"),
		},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{
			ap("10.96.0.50:80"): {weighted("10.96.0.11:8080", 50), weighted("10.96.0.12:80", 50)},
			ap("10.96.0.50:81"): {weighted("10.96.0.11:9090", 50), weighted("10.96.0.12:80", 50)}, // grpc is UDP there
		},
		wantTargets: map[netip.AddrPort]Target{ap("10.96.0.50:80"): helloRoute, ap("10.96.0.50:81"): helloRoute},
	}, {
		name:        "the Route does not exist: no entry for its addresses",
		routeSvcs:   []*corev1.Service{routeSvc, canarySvc},
		svcs:        []*corev1.Service{rev1},
		wantSkipped: map[Target]string{helloRoute: SkipRouteNotFound, canaryTag: SkipRouteNotFound},
	}, {
		name:        "no status.traffic yet",
		routes:      []servingv1alpha1.Route{rt("hello").Obj()},
		routeSvcs:   []*corev1.Service{routeSvc, canarySvc},
		wantSkipped: map[Target]string{helloRoute: SkipNoTraffic, canaryTag: SkipTagNotInTraffic},
	}, {
		name:        "every target at 0 %",
		routes:      []servingv1alpha1.Route{rt("hello").Split("hello-00001", 0).Obj()},
		routeSvcs:   []*corev1.Service{routeSvc},
		svcs:        []*corev1.Service{rev1},
		wantSkipped: map[Target]string{helloRoute: SkipNoTraffic},
		wantTargets: map[netip.AddrPort]Target{routeAddr: helloRoute},
	}, {
		name:        "a revision's public Service missing: no split (it would give its share to the others), the tag still",
		routes:      []servingv1alpha1.Route{rt("hello").Split("hello-00001", 30).Tagged("canary", "hello-00002", 70).Obj()},
		routeSvcs:   []*corev1.Service{routeSvc, canarySvc},
		svcs:        []*corev1.Service{rev2},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{canaryAddr: {weighted("10.96.0.12:80", 70)}},
		wantSkipped: map[Target]string{helloRoute: SkipRevisionNoService},
	}, {
		name:        "a target with percent but no revision name",
		routes:      []servingv1alpha1.Route{rt("hello").Split("hello-00001", 30).Split("", 70).Obj()},
		routeSvcs:   []*corev1.Service{routeSvc},
		svcs:        []*corev1.Service{rev1},
		wantSkipped: map[Target]string{helloRoute: SkipRevisionNoService},
		wantTargets: map[netip.AddrPort]Target{routeAddr: helloRoute},
	}, {
		name:      "a revision's public Service without a cluster IP of the Route address's family (IPv6 only, headless)",
		routes:    []servingv1alpha1.Route{rt("hello").Split("hello-00001", 30).Tagged("canary", "hello-00002", 70).Obj()},
		routeSvcs: []*corev1.Service{routeSvc, canarySvc},
		svcs: []*corev1.Service{
			service("hello-00001", ip("fd00::11"), "80"),
			service("hello-00002", ip("None"), "80"),
		},
		wantSkipped: map[Target]string{helloRoute: SkipRevisionNoAddress, canaryTag: SkipRevisionNoAddress},
	}, {
		name:      "IPv6: the split over the revisions' IPv6 addresses",
		routes:    []servingv1alpha1.Route{rt("hello").Split("hello-00001", 30).Tagged("canary", "hello-00002", 70).Obj()},
		routeSvcs: []*corev1.Service{routeService("hello", "", ip("fd5c:a1e:96::50"), "80"), routeService("hello", "canary", ip("fd5c:a1e:96::51"), "80")},
		svcs:      []*corev1.Service{service("hello-00001", ip("fd5c:a1e:96::11"), "80"), service("hello-00002", ip("fd5c:a1e:96::12"), "80")},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{
			ap("[fd5c:a1e:96::50]:80"): {weighted("[fd5c:a1e:96::11]:80", 30), weighted("[fd5c:a1e:96::12]:80", 70)},
			ap("[fd5c:a1e:96::51]:80"): {weighted("[fd5c:a1e:96::12]:80", 70)},
		},
		wantTargets: map[netip.AddrPort]Target{ap("[fd5c:a1e:96::50]:80"): helloRoute, ap("[fd5c:a1e:96::51]:80"): canaryTag},
	}, {
		name:      "dual-stack: each address splits over the revisions' addresses of its family",
		routes:    []servingv1alpha1.Route{rt("hello").Split("hello-00001", 30).Split("hello-00002", 70).Obj()},
		routeSvcs: []*corev1.Service{routeService("hello", "", []string{"fd5c:a1e:96::50", "10.96.0.50"}, "80")},
		svcs: []*corev1.Service{
			service("hello-00001", []string{"10.96.0.11", "fd5c:a1e:96::11"}, "80"),
			service("hello-00002", []string{"fd5c:a1e:96::12", "10.96.0.12"}, "80"),
		},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{
			ap("[fd5c:a1e:96::50]:80"): {weighted("[fd5c:a1e:96::11]:80", 30), weighted("[fd5c:a1e:96::12]:80", 70)},
			routeAddr:                  {weighted("10.96.0.11:80", 30), weighted("10.96.0.12:80", 70)},
		},
		wantTargets: map[netip.AddrPort]Target{ap("[fd5c:a1e:96::50]:80"): helloRoute, routeAddr: helloRoute},
	}, {
		name:      "dual-stack Route, a revision IPv4 only: the IPv6 address is skipped whole, the IPv4 one split",
		routes:    []servingv1alpha1.Route{rt("hello").Split("hello-00001", 30).Split("hello-00002", 70).Obj()},
		routeSvcs: []*corev1.Service{routeService("hello", "", []string{"10.96.0.50", "fd5c:a1e:96::50"}, "80")},
		svcs: []*corev1.Service{
			service("hello-00001", []string{"10.96.0.11", "fd5c:a1e:96::11"}, "80"),
			rev2,
		},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{routeAddr: {weighted("10.96.0.11:80", 30), weighted("10.96.0.12:80", 70)}},
		wantSkipped: map[Target]string{helloRoute: SkipRevisionNoAddress},
		wantTargets: map[netip.AddrPort]Target{ap("[fd5c:a1e:96::50]:80"): helloRoute, routeAddr: helloRoute},
	}, {
		name:        "the tag's Service names a tag the Route does not have",
		routes:      []servingv1alpha1.Route{rt("hello").Split("hello-00001", 100).Obj()},
		routeSvcs:   []*corev1.Service{routeSvc, canarySvc},
		svcs:        []*corev1.Service{rev1},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{routeAddr: {weighted("10.96.0.11:80", 100)}},
		wantSkipped: map[Target]string{canaryTag: SkipTagNotInTraffic},
	}, {
		name:   "the Route's own Service headless or UDP only",
		routes: []servingv1alpha1.Route{rt("hello").Tagged("canary", "hello-00001", 100).Obj()},
		routeSvcs: []*corev1.Service{
			routeService("hello", "", ip("None"), "80"),
			routeService("hello", "canary", ip("10.96.0.51"), "53/UDP"),
		},
		svcs:        []*corev1.Service{rev1},
		wantSkipped: map[Target]string{helloRoute: SkipHeadless, canaryTag: SkipNoTCPPort},
		wantTargets: map[netip.AddrPort]Target{},
	}, {
		name: "a Route in another namespace is not this one",
		routes: []servingv1alpha1.Route{func() servingv1alpha1.Route {
			r := rt("hello").Split("hello-00001", 100).Obj()
			r.Namespace = "other"
			return r
		}()},
		routeSvcs: []*corev1.Service{routeSvc},
		svcs: []*corev1.Service{rev1, func() *corev1.Service {
			s := service("hello-00001", ip("10.96.1.11"), "80")
			s.Namespace = "other"
			return s
		}()},
		wantSkipped: map[Target]string{helloRoute: SkipRouteNotFound},
		wantTargets: map[netip.AddrPort]Target{routeAddr: helloRoute},
	}, {
		name:        "Routes cannot be watched: no Route entry, the ServerlessServices' as before",
		routes:      []servingv1alpha1.Route{rt("hello").Split("hello-00001", 100).Obj()}, // stale
		routeSvcs:   []*corev1.Service{routeSvc, canarySvc},
		svcs:        []*corev1.Service{rev1, rev2},
		skses:       []v1alpha1.ServerlessService{sks("hello-00002").Proxy("act-a").Obj()},
		unavailable: true,
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{ap("10.96.0.12:80"): backends("10.0.0.1:8012")},
		wantSkipped: map[Target]string{helloRoute: SkipRoutesUnavailable, canaryTag: SkipRoutesUnavailable},
		wantTargets: map[netip.AddrPort]Target{routeAddr: helloRoute, canaryAddr: canaryTag, ap("10.96.0.12:80"): rev2SKS},
	}, {
		name:      "a ServerlessService naming the Route's Service has its address first, in any mode",
		routes:    []servingv1alpha1.Route{rt("hello").Split("hello-00001", 100).Tagged("canary", "hello-00001", 0).Obj()},
		routeSvcs: []*corev1.Service{routeSvc, canarySvc},
		svcs:      []*corev1.Service{rev1},
		skses: []v1alpha1.ServerlessService{
			sks("zzz").Public("hello").Proxy("act-a").Obj(),
			sks("zzz-canary").Public("canary-hello").Serve().Obj(),
		},
		wantEntries: map[netip.AddrPort][]bpfredirect.Backend{routeAddr: backends("10.0.0.1:8012")},
		wantSkipped: map[Target]string{helloRoute: SkipDuplicate, canaryTag: SkipDuplicate},
		wantTargets: map[netip.AddrPort]Target{
			routeAddr:  sksTarget(types.NamespacedName{Namespace: "default", Name: "zzz"}),
			canaryAddr: sksTarget(types.NamespacedName{Namespace: "default", Name: "zzz-canary"}),
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := Inputs{
				ServerlessServices: tt.skses, Services: services(append(append([]*corev1.Service{}, tt.svcs...), tt.routeSvcs...)...),
				Activators: activators, ActivatorPort: 8012,
				RouteServices: tt.routeSvcs, Routes: tt.routes, RoutesUnavailable: tt.unavailable,
			}
			d := Compute(in)
			got := make(map[netip.AddrPort][]bpfredirect.Backend)
			for a, e := range d.Entries {
				got[a] = e.Backends
				if e.Target != d.Targets[a] {
					t.Errorf("entry %s is %s's, but the address is counted for %s", a, e.Target, d.Targets[a])
				}
			}
			want := tt.wantEntries
			if want == nil {
				want = map[netip.AddrPort][]bpfredirect.Backend{}
			}
			if diff := cmp.Diff(want, got, cmpAddrs); diff != "" {
				t.Errorf("entries (-want +got):\n%s", diff)
			}
			wantSkipped := tt.wantSkipped
			if wantSkipped == nil {
				wantSkipped = map[Target]string{}
			}
			if diff := cmp.Diff(wantSkipped, d.Skipped); diff != "" {
				t.Errorf("skipped (-want +got):\n%s", diff)
			}
			wantTargets := tt.wantTargets
			if wantTargets == nil {
				wantTargets = map[netip.AddrPort]Target{routeAddr: helloRoute, canaryAddr: canaryTag}
			}
			if diff := cmp.Diff(wantTargets, d.Targets, cmpAddrs); diff != "" {
				t.Errorf("targets (-want +got):\n%s", diff)
			}
		})
	}
}

// TestComputeRouteRevisionsLimit: a split of bpfredirect.MaxBackends
// revisions is one entry; one more cannot be, and a part of it would send
// wrong shares, so there is none.
func TestComputeRouteRevisionsLimit(t *testing.T) {
	for _, n := range []int{bpfredirect.MaxBackends, bpfredirect.MaxBackends + 1} {
		b := rt("hello")
		svcs := []*corev1.Service{routeSvc}
		for i := range n {
			name := fmt.Sprintf("hello-%05d", i+1)
			b.Split(name, 1)
			svcs = append(svcs, service(name, ip(fmt.Sprintf("10.96.1.%d", i+1)), "80"))
		}
		d := Compute(Inputs{Services: services(svcs...), RouteServices: []*corev1.Service{routeSvc}, Routes: []servingv1alpha1.Route{b.Obj()}})
		got := len(d.Entries[routeAddr].Backends)
		switch {
		case n <= bpfredirect.MaxBackends && got != n:
			t.Errorf("%d revisions: %d backends, want %d (skipped: %v)", n, got, n, d.Skipped)
		case n > bpfredirect.MaxBackends && (got != 0 || d.Skipped[helloRoute] != SkipTooManyRevisions):
			t.Errorf("%d revisions: %d backends, skipped %q; want no entry, skipped %q", n, got, d.Skipped[helloRoute], SkipTooManyRevisions)
		}
	}
}

// TestComputeRoutesDuplicates: two Routes' Services can share an address
// only by both naming one Service; the first Route by namespace/name has
// it, every time, whatever the order of the inputs.
func TestComputeRoutesDuplicates(t *testing.T) {
	// One Service listed twice with different route labels, as two
	// Routes would see it if its label were rewritten between lists.
	a := routeService("alpha", "", ip("10.96.0.50"), "80")
	b := routeService("beta", "", ip("10.96.0.50"), "80")
	b.Name = "beta"
	routes := []servingv1alpha1.Route{rt("beta").Split("hello-00002", 100).Obj(), rt("alpha").Split("hello-00001", 100).Obj()}
	for _, order := range [][]*corev1.Service{{a, b}, {b, a}} {
		d := Compute(Inputs{Services: services(rev1, rev2), RouteServices: order, Routes: routes})
		want := map[netip.AddrPort][]bpfredirect.Backend{routeAddr: {weighted("10.96.0.11:80", 100)}}
		got := map[netip.AddrPort][]bpfredirect.Backend{}
		for a, e := range d.Entries {
			got[a] = e.Backends
		}
		if diff := cmp.Diff(want, got, cmpAddrs); diff != "" {
			t.Errorf("entries (-want +got):\n%s", diff)
		}
		beta := Target{Kind: KindRoute, NamespacedName: types.NamespacedName{Namespace: "default", Name: "beta"}}
		if diff := cmp.Diff(map[Target]string{beta: SkipDuplicate}, d.Skipped); diff != "" {
			t.Errorf("skipped (-want +got):\n%s", diff)
		}
	}
}
