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
	clocktesting "k8s.io/utils/clock/testing"

	bpfredirect "github.com/sockscale/sockscale/bpf/redirect"
	"github.com/sockscale/sockscale/controller/api/v1alpha1"
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
	r := newReconciler(nil, Options{Map: m})

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
	r := newReconciler(nil, Options{Map: m})
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
	r := newReconciler(nil, Options{Map: m})
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
	r := newReconciler(nil, Options{Map: m})
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
	if err := newReconciler(nil, Options{Map: m, ResyncPeriod: time.Minute}).syncTo(proxy, true); err != nil {
		t.Fatal(err)
	}
	if got := m.leases[len(m.leases)-1]; got != 3*time.Minute {
		t.Errorf("lease with a 1m resync period = %v, want 3m (three periods)", got)
	}
}

func TestUpdateLatencyIsFromTheStatusChangeSeen(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	m := newFakeMap()
	r := newReconciler(nil, Options{Map: m, Clock: clk})
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

func TestMetrics(t *testing.T) {
	m := newFakeMap()
	reg := prometheus.NewRegistry()
	r := newReconciler(nil, Options{Map: m, Registerer: reg})
	d := desired(sks("hello").Proxy("act-a").Obj(), sks("world").Serve().Obj(), sks("gone").Proxy("act-a").Obj())
	if err := r.syncTo(d, true); err != nil {
		t.Fatal(err)
	}
	m.redirected[ap("10.96.0.10:80")] = 12
	m.redirected[ap("10.96.0.20:80")] = 3 // world, redirected while it was in Proxy mode
	m.redirected[ap("10.96.0.77:80")] = 4 // nobody's: no series
	want := `
# HELP sockscale_agent_redirect_connects_total Connects on this node that the kernel sent to an activator instead of the public Service's address, by ServerlessService and port of the Service.
# TYPE sockscale_agent_redirect_connects_total counter
sockscale_agent_redirect_connects_total{namespace="default",port="80",serverlessservice="hello"} 12
sockscale_agent_redirect_connects_total{namespace="default",port="80",serverlessservice="world"} 3
# HELP sockscale_agent_redirect_entries Service addresses (cluster IP and port) the kernel redirects to activators on this node.
# TYPE sockscale_agent_redirect_entries gauge
sockscale_agent_redirect_entries 1
# HELP sockscale_agent_redirect_kernel_events_total Unusual paths of the redirect programs, by event: entry_refused (an unusable entry, the connect left alone), no_origin (redirected, but getpeername shows the activator), counter_lost (redirected, not counted), lease_expired (an entry ignored: the agent's lease on the map had lapsed, the connect left alone).
# TYPE sockscale_agent_redirect_kernel_events_total counter
sockscale_agent_redirect_kernel_events_total{event="counter_lost"} 0
sockscale_agent_redirect_kernel_events_total{event="entry_refused"} 0
sockscale_agent_redirect_kernel_events_total{event="lease_expired"} 0
sockscale_agent_redirect_kernel_events_total{event="no_origin"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sockscale_agent_redirect_connects_total",
		"sockscale_agent_redirect_entries", "sockscale_agent_redirect_kernel_events_total"); err != nil {
		t.Error(err)
	}
	if got := testutil.ToFloat64(r.metrics.skipped.WithLabelValues(SkipNoService)); got != 1 {
		t.Errorf("skipped{reason=service_not_found} = %v, want 1 (gone)", got)
	}
}
