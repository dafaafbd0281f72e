package redirect

import (
	"errors"
	"maps"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	bpfredirect "github.com/sockscale/sockscale/bpf/redirect"
)

// fakeMap is the kernel map in memory, with a log of the writes.
type fakeMap struct {
	// mu: Run's tests write from its goroutine and read from the test's.
	mu         sync.Mutex
	entries    map[netip.AddrPort][]bpfredirect.Backend
	redirected map[netip.AddrPort]uint64
	writes     []string
	failSet    error
	reads      int
	leases     []time.Duration // Renew's ttls, in order
}

func newFakeMap() *fakeMap {
	return &fakeMap{entries: map[netip.AddrPort][]bpfredirect.Backend{}, redirected: map[netip.AddrPort]uint64{}}
}

func (m *fakeMap) Set(svc netip.AddrPort, b []bpfredirect.Backend) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failSet != nil {
		return m.failSet
	}
	m.writes = append(m.writes, "set "+svc.String())
	m.entries[svc] = b
	return nil
}

func (m *fakeMap) Delete(svc netip.AddrPort) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.writes = append(m.writes, "delete "+svc.String())
	delete(m.entries, svc)
	return nil
}

func (m *fakeMap) Forget(svc netip.AddrPort) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.writes = append(m.writes, "forget "+svc.String())
	delete(m.entries, svc)
	delete(m.redirected, svc)
	return nil
}

func (m *fakeMap) Entries() (map[netip.AddrPort][]bpfredirect.Backend, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reads++
	return maps.Clone(m.entries), nil
}

func (m *fakeMap) Redirected() (map[netip.AddrPort]uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.redirected), nil
}
func (m *fakeMap) Events() (bpfredirect.Events, error) { return bpfredirect.Events{NoOrigin: 2}, nil }

func (m *fakeMap) Renew(ttl time.Duration) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.leases = append(m.leases, ttl)
	return nil
}

func (m *fakeMap) renewals() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.leases)
}

func (m *fakeMap) takeWrites() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := m.writes
	m.writes = nil
	return w
}

// desired computes the desired state of the ServerlessServices with the
// test's Services (hello 10.96.0.10:80, world 10.96.0.20:80).
func desired(skses ...v1alpha1.ServerlessService) Desired {
	return Compute(Inputs{
		ServerlessServices: skses,
		Services:           services(service("hello", []string{"10.96.0.10"}, "80"), service("world", []string{"10.96.0.20"}, "80")),
		Activators:         activators, ActivatorPort: 8012,
	})
}

func TestResyncRemovesWhatIsNotDesired(t *testing.T) {
	m := newFakeMap()
	// Left by an earlier agent: hello was in Proxy mode (it is in Serve
	// now), and 10.96.0.99 is no ServerlessService's Service any more.
	m.entries[ap("10.96.0.10:80")] = backends("10.0.0.9:8012")
	m.entries[ap("10.96.0.99:80")] = backends("10.0.0.9:8012")
	m.redirected[ap("10.96.0.10:80")] = 5
	m.redirected[ap("10.96.0.99:80")] = 7
	m.redirected[ap("10.96.0.98:80")] = 1 // entry deleted earlier, counter left
	r := newReconciler(cacheFactories{}, Options{Map: m})

	if err := r.syncTo(desired(sks("hello").Serve().Obj(), sks("world").Proxy("act-a").Obj()), true); err != nil {
		t.Fatal(err)
	}
	want := []string{"delete 10.96.0.10:80", "forget 10.96.0.99:80", "set 10.96.0.20:80", "forget 10.96.0.98:80"}
	if diff := cmp.Diff(want, m.takeWrites()); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[netip.AddrPort][]bpfredirect.Backend{ap("10.96.0.20:80"): backends("10.0.0.1:8012")}, m.entries, cmpAddrs); diff != "" {
		t.Errorf("map after the resync (-want +got):\n%s", diff)
	}
	// hello's counter stays: its Service is there, it may go to Proxy again.
	if diff := cmp.Diff(map[netip.AddrPort]uint64{ap("10.96.0.10:80"): 5}, m.redirected, cmpAddrs); diff != "" {
		t.Errorf("counters after the resync (-want +got):\n%s", diff)
	}
}

var cmpAddrs = cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })

func TestEventsWriteOnlyTheDifference(t *testing.T) {
	m := newFakeMap()
	r := newReconciler(cacheFactories{}, Options{Map: m})
	steps := []struct {
		name  string
		skses []v1alpha1.ServerlessService
		want  []string
	}{
		{"both serve", []v1alpha1.ServerlessService{sks("hello").Serve().Obj(), sks("world").Serve().Obj()}, nil},
		{"hello to proxy", []v1alpha1.ServerlessService{sks("hello").Proxy("act-a").Obj(), sks("world").Serve().Obj()}, []string{"set 10.96.0.10:80"}},
		{"unchanged", []v1alpha1.ServerlessService{sks("hello").Proxy("act-a").Obj(), sks("world").Serve().Obj()}, nil},
		{"an activator more", []v1alpha1.ServerlessService{sks("hello").Proxy("act-a", "act-b").Obj(), sks("world").Serve().Obj()}, []string{"set 10.96.0.10:80"}},
		{"hello back to serve", []v1alpha1.ServerlessService{sks("hello").Serve().Obj(), sks("world").Serve().Obj()}, []string{"delete 10.96.0.10:80"}},
		{"hello's ServerlessService deleted while in proxy", []v1alpha1.ServerlessService{sks("world").Serve().Obj()}, nil},
	}
	for i, s := range steps {
		if err := r.syncTo(desired(s.skses...), i == 0); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if diff := cmp.Diff(s.want, m.takeWrites()); diff != "" {
			t.Errorf("%s: writes (-want +got):\n%s", s.name, diff)
		}
	}
	if m.reads != 1 {
		t.Errorf("the map was read %d times, want once (the first, full, sync)", m.reads)
	}
	if got := testutil.ToFloat64(r.metrics.updates.WithLabelValues(opSet, resultOK)); got != 2 {
		t.Errorf("updates{op=set,result=ok} = %v, want 2", got)
	}
}

func TestAFailedWriteIsRetriedFromTheKernelsState(t *testing.T) {
	m := newFakeMap()
	r := newReconciler(cacheFactories{}, Options{Map: m})
	if err := r.syncTo(desired(), true); err != nil {
		t.Fatal(err)
	}
	m.failSet = errors.New("set 10.96.0.10:80: the map is full")
	proxy := desired(sks("hello").Proxy("act-a").Obj())
	if err := r.syncTo(proxy, false); err == nil || !strings.Contains(err.Error(), "the map is full") {
		t.Fatalf("sync = %v, want the write's error", err)
	}
	if got := testutil.ToFloat64(r.metrics.updates.WithLabelValues(opSet, resultError)); got != 1 {
		t.Errorf("updates{op=set,result=error} = %v, want 1", got)
	}
	m.failSet = nil
	if err := r.syncTo(proxy, false); err != nil {
		t.Fatal(err)
	}
	if m.reads != 2 {
		t.Errorf("the map was read %d times, want 2: the sync after a failure compares with the kernel's state", m.reads)
	}
	if _, ok := m.entries[ap("10.96.0.10:80")]; !ok {
		t.Error("hello's entry was not written on the retry")
	}
}

// TestLeaseRenewedOnlyByAFullSyncThatWroteEverything: the kernel follows
// the entries only while a full sync keeps finding the map equal to the
// cluster (or making it so); event syncs and failed writes do not renew.
func TestLeaseRenewedOnlyByAFullSyncThatWroteEverything(t *testing.T) {
	m := newFakeMap()
	r := newReconciler(cacheFactories{}, Options{Map: m})
	proxy := desired(sks("hello").Proxy("act-a").Obj())
	if err := r.syncTo(proxy, true); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]time.Duration{LeaseTTL}, m.leases); diff != "" {
		t.Fatalf("leases after a full sync (-want +got):\n%s", diff)
	}
	if err := r.syncTo(desired(sks("hello").Serve().Obj()), false); err != nil {
		t.Fatal(err)
	}
	m.failSet = errors.New("set 10.96.0.10:80: the map is full")
	if err := r.syncTo(proxy, true); err == nil {
		t.Fatal("a full sync whose write failed returned nil")
	}
	if n := m.renewals(); n != 1 {
		t.Errorf("%d renewals, want 1: neither an event's sync nor a full sync with a failed write renews", n)
	}
	m.failSet = nil
	if err := newReconciler(cacheFactories{}, Options{Map: m, ResyncPeriod: time.Minute}).syncTo(proxy, true); err != nil {
		t.Fatal(err)
	}
	if got := m.leases[len(m.leases)-1]; got != 3*time.Minute {
		t.Errorf("lease with a 1m resync period = %v, want 3m (three periods)", got)
	}
}

func TestUpdateLatencyIsFromTheStatusChangeSeen(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	m := newFakeMap()
	r := newReconciler(cacheFactories{}, Options{Map: m, Clock: clk})
	r.synced.Store(true)
	if err := r.syncTo(desired(sks("hello").Serve().Obj()), true); err != nil {
		t.Fatal(err)
	}
	serve, proxy := sks("hello").Serve().Obj(), sks("hello").Proxy("act-a").Obj()
	r.event(&serve, &proxy)
	clk.Step(3 * time.Millisecond)
	r.event(&serve, &proxy) // the same change seen again: the first time counts
	clk.Step(2 * time.Millisecond)
	if err := r.syncTo(desired(proxy), false); err != nil {
		t.Fatal(err)
	}
	// A status change that needs no write (world has no Service entry to
	// change) is not a sample.
	world, worldProxy := sks("world").Serve().Obj(), sks("world").Serve().Ready("False", "NoEndpoints").Obj()
	r.event(&world, &worldProxy)
	if err := r.syncTo(desired(proxy), false); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(r.metrics.latency)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	h := mfs[0].Metric[0].Histogram
	if h.GetSampleCount() != 1 || h.GetSampleSum() != 0.005 {
		t.Errorf("latency samples: count %d sum %v, want one of 0.005 s (first seen -> written)", h.GetSampleCount(), h.GetSampleSum())
	}
}

// TestMetrics: connects are counted per ServerlessService in the
// existing series and per Route and tag in their own; entries and skips
// by kind.
func TestMetrics(t *testing.T) {
	m := newFakeMap()
	reg := prometheus.NewRegistry()
	r := newReconciler(cacheFactories{}, Options{Map: m, Registerer: reg})
	r.routes.set(newStubCache(t), nil) // the Routes are watched
	d := Compute(Inputs{
		ServerlessServices: []v1alpha1.ServerlessService{sks("hello").Proxy("act-a").Obj(), sks("world").Serve().Obj(), sks("gone").Proxy("act-a").Obj()},
		Services: services(service("hello", []string{"10.96.0.10"}, "80"), service("world", []string{"10.96.0.20"}, "80"),
			rev1, rev2),
		Activators: activators, ActivatorPort: 8012,
		RouteServices: []*corev1.Service{routeSvc, canarySvc, routeService("bye", "", ip("10.96.0.60"), "80")},
		Routes:        []servingv1alpha1.Route{rt("hello").Split("hello-00001", 30).Tagged("canary", "hello-00002", 70).Obj()},
	})
	if err := r.syncTo(d, true); err != nil {
		t.Fatal(err)
	}
	m.redirected[ap("10.96.0.10:80")] = 12
	m.redirected[ap("10.96.0.20:80")] = 3 // world, redirected while it was in Proxy mode
	m.redirected[ap("10.96.0.77:80")] = 4 // nobody's: no series
	m.redirected[routeAddr] = 10
	m.redirected[canaryAddr] = 2
	m.redirected[ap("10.96.0.60:80")] = 1 // bye, whose Route is gone
	want := `
# HELP sockscale_agent_redirect_connects_total Connects on this node that the kernel sent to an activator instead of the public Service's address, by ServerlessService and port of the Service.
# TYPE sockscale_agent_redirect_connects_total counter
sockscale_agent_redirect_connects_total{namespace="default",port="80",serverlessservice="hello"} 12
sockscale_agent_redirect_connects_total{namespace="default",port="80",serverlessservice="world"} 3
# HELP sockscale_agent_redirect_route_connects_total Connects on this node that the kernel sent from a Route's address to the public Service of one of its revisions (by the split's weights, or a tag's revision), by namespace, route, tag (empty for the Route's own address) and port of the Route's Service. A connect that goes on to an activator (the revision is in Proxy mode) also counts in sockscale_agent_redirect_connects_total.
# TYPE sockscale_agent_redirect_route_connects_total counter
sockscale_agent_redirect_route_connects_total{namespace="default",port="80",route="bye",tag=""} 1
sockscale_agent_redirect_route_connects_total{namespace="default",port="80",route="hello",tag=""} 10
sockscale_agent_redirect_route_connects_total{namespace="default",port="80",route="hello",tag="canary"} 2
# HELP sockscale_agent_redirect_entries Service addresses (cluster IP and port) the kernel redirects on this node, by kind: serverlessservice (a public Service in Proxy mode, to activators), route (a Route's own address, to its revisions by percent), tag (a tag's address, to its revision), stale (no longer wanted, its delete failed and is retried).
# TYPE sockscale_agent_redirect_entries gauge
sockscale_agent_redirect_entries{kind="route"} 1
sockscale_agent_redirect_entries{kind="serverlessservice"} 1
sockscale_agent_redirect_entries{kind="stale"} 0
sockscale_agent_redirect_entries{kind="tag"} 1
# HELP sockscale_agent_redirect_kernel_events_total Unusual paths of the redirect programs, by event: entry_refused (an unusable entry, the connect left alone), no_origin (redirected, but getpeername shows the activator), counter_lost (redirected, not counted), lease_expired (an entry ignored: the agent's lease on the map had lapsed, the connect left alone).
# TYPE sockscale_agent_redirect_kernel_events_total counter
sockscale_agent_redirect_kernel_events_total{event="counter_lost"} 0
sockscale_agent_redirect_kernel_events_total{event="entry_refused"} 0
sockscale_agent_redirect_kernel_events_total{event="lease_expired"} 0
sockscale_agent_redirect_kernel_events_total{event="no_origin"} 2
# HELP sockscale_agent_redirect_routes_state How the Route entries (traffic splits) stand on this node: 1 for the current state, 0 for the others, by state: active, syncing (starting, or the Routes' watch fails), unavailable (the serving CRDs are missing or Routes are forbidden: no Route address has an entry, the agent retries). ServerlessService entries do not depend on it.
# TYPE sockscale_agent_redirect_routes_state gauge
sockscale_agent_redirect_routes_state{state="active"} 1
sockscale_agent_redirect_routes_state{state="syncing"} 0
sockscale_agent_redirect_routes_state{state="unavailable"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sockscale_agent_redirect_connects_total", "sockscale_agent_redirect_route_connects_total",
		"sockscale_agent_redirect_entries", "sockscale_agent_redirect_kernel_events_total", "sockscale_agent_redirect_routes_state"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(r.metrics.skipped); n != len(SkipReasons)+2*len(RouteSkipReasons) {
		t.Errorf("%d skipped series, want every reason of each kind (%d)", n, len(SkipReasons)+2*len(RouteSkipReasons))
	}
	for _, s := range []struct {
		kind, reason string
		want         float64
	}{
		{KindServerlessService, SkipNoService, 1}, // gone
		{KindRoute, SkipRouteNotFound, 1},         // bye
		{KindTag, SkipRouteNotFound, 0},
	} {
		if got := testutil.ToFloat64(r.metrics.skipped.WithLabelValues(s.kind, s.reason)); got != s.want {
			t.Errorf("skipped{kind=%s,reason=%s} = %v, want %v", s.kind, s.reason, got, s.want)
		}
	}
}
