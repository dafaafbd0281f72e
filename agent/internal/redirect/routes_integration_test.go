//go:build linux

package redirect

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	bpfredirect "github.com/sockscale/sockscale/bpf/redirect"
	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

var httpPort = corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}

// routeService makes a Route's Kubernetes Service as the controller does
// (<route>, or <tag>-<route> with the tag label) and returns its address.
func (e *itEnv) routeService(t testing.TB, route, tag string) netip.AddrPort {
	t.Helper()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: route, Labels: map[string]string{servingv1alpha1.RouteLabelKey: route}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{httpPort}},
	}
	if tag != "" {
		svc.Name = tag + "-" + route
		svc.Labels[servingv1alpha1.TagLabelKey] = tag
	}
	if err := e.cl.Client.Create(context.Background(), svc); err != nil {
		t.Fatal(err)
	}
	return netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80)
}

// split is a traffic split: revision, percent and tag of each target.
type split []servingv1alpha1.TrafficTargetStatus

func target(revision string, percent int64, tag string) servingv1alpha1.TrafficTargetStatus {
	return servingv1alpha1.TrafficTargetStatus{RevisionName: revision, Percent: &percent, Tag: tag}
}

// route makes a Route whose spec and status.traffic are s, as the
// controller would once it resolved them.
func (e *itEnv) route(t testing.TB, name string, s split) {
	t.Helper()
	rt := &servingv1alpha1.Route{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	for _, tt := range s {
		rt.Spec.Traffic = append(rt.Spec.Traffic, servingv1alpha1.TrafficTarget{RevisionName: tt.RevisionName, Percent: tt.Percent, Tag: tt.Tag})
	}
	if err := e.cl.Client.Create(context.Background(), rt); err != nil {
		t.Fatal(err)
	}
	e.setTraffic(t, name, s)
}

// setTraffic writes the Route's status.traffic.
func (e *itEnv) setTraffic(t testing.TB, name string, s split) {
	t.Helper()
	ctx := context.Background()
	var rt servingv1alpha1.Route
	if err := e.cl.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &rt); err != nil {
		t.Fatal(err)
	}
	rt.Status.Traffic = s
	if err := e.cl.Client.Status().Update(ctx, &rt); err != nil {
		t.Fatal(err)
	}
}

// sorted are backends in the map's order, by address (the API server
// allocates the cluster IPs).
func sorted(b ...bpfredirect.Backend) []bpfredirect.Backend {
	slices.SortFunc(b, func(x, y bpfredirect.Backend) int { return x.Addr.Compare(y.Addr) })
	return b
}

func (e *itEnv) waitSynced(t testing.TB, r *Reconciler) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "the Reconciler synced", func() (bool, string) {
		return r.Synced(), fmt.Sprintf("%+v", r.State())
	})
}

// TestIntegrationMapFollowsRoutes runs the Reconciler against a real
// kube-apiserver and the real kernel map: a Route split 30/70 across two
// revisions with a tag on the second has an entry for its address with
// the percents as weights and one for the tag's address (its one
// revision, weighted by its percent),
// beside the ServerlessService entry of the second revision, in Proxy
// mode; a change of status.traffic rewrites the split; deleting the Route
// removes its entries and leaves the ServerlessService's.
func TestIntegrationMapFollowsRoutes(t *testing.T) {
	e := newITEnv(t)
	e.activatorPod(t, "act-a", "10.244.0.5", true)
	rev1 := netip.AddrPortFrom(e.publicService(t, "hello-00001", httpPort), 80)
	rev2 := netip.AddrPortFrom(e.publicService(t, "hello-00002", httpPort), 80)
	e.serverlessService(t, "hello-00002", 80)
	e.setStatus(t, "hello-00002", v1alpha1.ModeProxy, "act-a")
	hello, canary := e.routeService(t, "hello", ""), e.routeService(t, "hello", "canary")
	e.route(t, "hello", split{target("hello-00001", 30, ""), target("hello-00002", 70, "canary")})

	r := e.run(t, prometheus.NewRegistry(), time.Second)
	e.waitSynced(t, r)
	proxied := backends("10.244.0.5:8012")
	e.waitEntries(t, "split 30/70, a tag", map[netip.AddrPort][]bpfredirect.Backend{
		hello:  sorted(bpfredirect.Backend{Addr: rev1, Weight: 30}, bpfredirect.Backend{Addr: rev2, Weight: 70}),
		canary: {{Addr: rev2, Weight: 70}},
		rev2:   proxied,
	})
	if s := r.State(); s != (stats.NodeState{SocketRedirect: stats.RedirectActive}) {
		t.Errorf("State() = %+v, want active without a reason", s)
	}

	e.setTraffic(t, "hello", split{target("hello-00001", 90, "canary"), target("hello-00002", 10, "")})
	e.waitEntries(t, "split 90/10, the tag on the first", map[netip.AddrPort][]bpfredirect.Backend{
		hello:  sorted(bpfredirect.Backend{Addr: rev1, Weight: 90}, bpfredirect.Backend{Addr: rev2, Weight: 10}),
		canary: {{Addr: rev1, Weight: 90}},
		rev2:   proxied,
	})

	if err := e.cl.Client.Delete(context.Background(), &servingv1alpha1.Route{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"}}); err != nil {
		t.Fatal(err)
	}
	e.waitEntries(t, "Route deleted", map[netip.AddrPort][]bpfredirect.Backend{rev2: proxied})
	for _, kind := range []string{KindRoute, KindTag} {
		testenv.Eventually(t, 5*time.Second, kind+" skipped, route_not_found", func() (bool, string) {
			got := testutil.ToFloat64(r.metrics.skipped.WithLabelValues(kind, SkipRouteNotFound))
			return got == 1, fmt.Sprint(got)
		})
	}
}

// TestIntegrationRouteSplitRealConnects: a client on the node dials a
// Route's cluster IP, split 50/50 between a revision with a pod (its
// cluster IP on lo in the test's network namespace, as kube-proxy would
// reach it) and one at zero in Proxy mode, whose own entry takes the
// connect on to the activator (the kernel's second hop). Every connect is
// answered by one of the two, both answer, and the client sees the Route's
// address as its peer.
func TestIntegrationRouteSplitRealConnects(t *testing.T) {
	e := newITEnv(t)
	const activatorIP = "10.244.0.7"
	rev1 := netip.AddrPortFrom(e.publicService(t, "hello-00001", httpPort), 80)
	rev2 := netip.AddrPortFrom(e.publicService(t, "hello-00002", httpPort), 80)
	hello := e.routeService(t, "hello", "")
	ns := newNetns(t, activatorIP, rev1.Addr().String())
	for addr, name := range map[string]string{rev1.String(): "revision-1", activatorIP + ":8012": "activator"} {
		var ln net.Listener
		var err error
		ns.run(func() { ln, err = net.Listen("tcp4", addr) })
		if err != nil {
			t.Fatalf("listen on %s in the netns: %v", addr, err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_, _ = c.Write([]byte(name + "\n"))
				c.Close()
			}
		}()
	}
	e.activatorPod(t, "act-a", activatorIP, true)
	e.serverlessService(t, "hello-00002", 80)
	e.setStatus(t, "hello-00002", v1alpha1.ModeProxy, "act-a")
	e.route(t, "hello", split{target("hello-00001", 50, ""), target("hello-00002", 50, "")})
	reg := prometheus.NewRegistry()
	e.run(t, reg, time.Second)
	e.waitEntries(t, "split and Proxy", map[netip.AddrPort][]bpfredirect.Backend{
		hello: sorted(bpfredirect.Backend{Addr: rev1, Weight: 50}, bpfredirect.Backend{Addr: rev2, Weight: 50}),
		rev2:  backends(activatorIP + ":8012"),
	})

	enterCgroup(t, filepath.Join(e.root, "client"))
	const n = 40
	answered := map[string]int{}
	for i := range n {
		var answer string
		var peer net.Addr
		var err error
		ns.run(func() {
			var c net.Conn
			if c, err = net.DialTimeout("tcp4", hello.String(), 2*time.Second); err != nil {
				return
			}
			defer c.Close()
			peer = c.RemoteAddr()
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			answer, err = bufio.NewReader(c).ReadString('\n')
		})
		if err != nil {
			t.Fatalf("connect %d to the Route's %s: %v", i+1, hello, err)
		}
		if peer.String() != hello.String() {
			t.Errorf("connect %d: the client sees its peer as %s, want the Route's address %s", i+1, peer, hello)
		}
		answered[strings.TrimSpace(answer)]++
	}
	t.Logf("answered: %v", answered)
	// Both at 50 %: one never answering out of 40 has odds of 2^-39.
	if answered["revision-1"] == 0 || answered["activator"] == 0 || answered["revision-1"]+answered["activator"] != n {
		t.Errorf("answered by %v; want all %d by revision-1 (one hop) or the activator (two hops), both", answered, n)
	}
	want := fmt.Sprintf(`
# HELP sockscale_agent_redirect_route_connects_total Connects on this node that the kernel sent from a Route's address to the public Service of one of its revisions (by the split's weights, or a tag's revision), by namespace, route, tag (empty for the Route's own address) and port of the Route's Service. A connect that goes on to an activator (the revision is in Proxy mode) also counts in sockscale_agent_redirect_connects_total.
# TYPE sockscale_agent_redirect_route_connects_total counter
sockscale_agent_redirect_route_connects_total{namespace="default",port="80",route="hello",tag=""} %d
# HELP sockscale_agent_redirect_connects_total Connects on this node that the kernel sent to an activator instead of the public Service's address, by ServerlessService and port of the Service.
# TYPE sockscale_agent_redirect_connects_total counter
sockscale_agent_redirect_connects_total{namespace="default",port="80",serverlessservice="hello-00002"} %d
`, n, answered["activator"])
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sockscale_agent_redirect_route_connects_total", "sockscale_agent_redirect_connects_total"); err != nil {
		t.Error(err)
	}
}

// TestIntegrationRoutesWithoutTheServingCRDs: without the Route CRD the
// ServerlessServices' entries work as before, the state is active with a
// reason naming the missing Routes, a Route's Service is skipped as
// routes_unavailable; once the CRD is installed again a retry watches
// Routes, without a restart, and the split is written.
func TestIntegrationRoutesWithoutTheServingCRDs(t *testing.T) {
	const routes = "routes.serving.sockscale.dev"
	e := newITEnv(t, testenv.WithoutCRD(routes))
	e.activatorPod(t, "act-a", "10.244.0.5", true)
	rev1 := netip.AddrPortFrom(e.publicService(t, "hello-00001", httpPort), 80)
	e.serverlessService(t, "hello-00001", 80)
	e.setStatus(t, "hello-00001", v1alpha1.ModeProxy, "act-a")
	hello := e.routeService(t, "hello", "")

	reg := prometheus.NewRegistry()
	r := e.run(t, reg, time.Second, func(o *Options) { o.RetryBackoff = 200 * time.Millisecond })
	e.waitSynced(t, r)
	proxied := map[netip.AddrPort][]bpfredirect.Backend{rev1: backends("10.244.0.5:8012")}
	e.waitEntries(t, "without Routes: the ServerlessService's entry", proxied)
	testenv.Eventually(t, 10*time.Second, "active, the reason naming the missing Routes", func() (bool, string) {
		s := r.State()
		return s.SocketRedirect == stats.RedirectActive && strings.Contains(s.Reason, `Route entries unavailable: watch *v1alpha1.Route: no matches for kind "Route"`) &&
			testutil.ToFloat64(r.metrics.skipped.WithLabelValues(KindRoute, SkipRoutesUnavailable)) == 1, fmt.Sprintf("%+v", s)
	})
	t.Logf("state without the Route CRD: %+v", r.State())

	e.cl.InstallCRD(t, routes)
	testenv.Eventually(t, 30*time.Second, "the Route CRD served", func() (bool, string) {
		err := e.cl.Client.List(context.Background(), &servingv1alpha1.RouteList{})
		return err == nil, fmt.Sprint(err)
	})
	e.route(t, "hello", split{target("hello-00001", 100, "")})
	testenv.Eventually(t, 30*time.Second, "a retry watching Routes", func() (bool, string) {
		s := r.State()
		return s == (stats.NodeState{SocketRedirect: stats.RedirectActive}), fmt.Sprintf("%+v", s)
	})
	proxied[hello] = []bpfredirect.Backend{{Addr: rev1, Weight: 100}}
	e.waitEntries(t, "with Routes", proxied)
}
