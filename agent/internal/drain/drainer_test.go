package drain

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sockscale/sockscale/agent/internal/endpointwatch"
	"github.com/sockscale/sockscale/agent/internal/podwatch"
	"github.com/sockscale/sockscale/bpf"
)

// countingKernel counts one pod's requests as the test sets them; it has
// no connection of its own (noConns).
type countingKernel struct {
	noKernel
	mu  sync.Mutex
	ip  netip.Addr
	req bpf.RequestCounters
}

func (k *countingKernel) Snapshot() (bpf.Snapshot, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return bpf.Snapshot{Pods: map[netip.Addr]bpf.PodCounters{k.ip: {Requests: k.req}}}, nil
}

// TestDrainedWhenTheKernelIsQuiet: a pod whose process shows no
// connection (they wait in its accept queue, or came after the round)
// is not drained while the kernel counts a request in flight on it or
// new requests still start (a kube-proxy or activator that has not yet
// stopped sending it any): only Quiet after the last one started, with
// none in flight.
//
// A dual-stack pod's requests on its IPv6 address (a slot of its own in
// the kernel) hold it the same way.
func TestDrainedWhenTheKernelIsQuiet(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fd5c:a1e:0:1::5")
	t.Run("IPv4", func(t *testing.T) { testDrainedWhenQuiet(t, []netip.Addr{v4}, v4) })
	t.Run("dual-stack, requests on IPv6", func(t *testing.T) { testDrainedWhenQuiet(t, []netip.Addr{v4, v6}, v6) })
}

// testDrainedWhenQuiet drains a pod with addresses ips whose requests the
// kernel counts on counted.
func testDrainedWhenQuiet(t *testing.T, ips []netip.Addr, counted netip.Addr) {
	t0 := time.Unix(1000, 0)
	clk := clocktesting.NewFakeClock(t0)
	pods := &fakePods{l: []podwatch.Leaving{{Pod: podwatch.Pod{Namespace: "shop", Workload: "cart", UID: "u1"}, IPs: ips, Since: t0}}}
	k := &countingKernel{ip: counted}
	d := New(k, pods, noConns{}, Options{Clock: clk, MinWait: 500 * time.Millisecond, Quiet: time.Second, Registerer: prometheus.NewRegistry()})
	// One drain started, in progress until it is done.
	gauge := func() float64 {
		if started := promtestutil.ToFloat64(d.metrics.started); started != 1 {
			t.Errorf("%v drains started, want 1", started)
		}
		return promtestutil.ToFloat64(d.metrics.draining)
	}
	var doneAt time.Duration
	for at := time.Duration(0); at <= 5*time.Second && doneAt == 0; at += 250 * time.Millisecond {
		clk.SetTime(t0.Add(at))
		k.mu.Lock()
		if at <= 2*time.Second {
			k.req.Started++ // a new request every round until 2 s ...
		}
		k.req.InFlight = 0
		if at < 2500*time.Millisecond {
			k.req.InFlight = 1 // ... the last one answered at 2.5 s
		}
		k.mu.Unlock()
		d.Round()
		if d.states["u1"].done {
			doneAt = at
		}
		if want := map[bool]float64{true: 0, false: 1}[doneAt != 0]; gauge() != want {
			t.Errorf("at %v: %v drains in progress, want %v", at, gauge(), want)
		}
		if r := d.waitResult("shop", "cart"); doneAt == 0 && at < 2500*time.Millisecond && r.InFlight != 1 {
			t.Errorf("at %v: the wait reports %d in flight, want the kernel's 1", at, r.InFlight)
		}
	}
	if doneAt != 3*time.Second {
		t.Errorf("drained at %v, want 3s: Quiet (1s) after the last request started (2s), none in flight since 2.5s", doneAt)
	}
}

// TestWaitIsForThePodsBeingDeleted: the kubelet calls a pod's preStop
// hook as soon as it sees the deletion, which the agent's watch may show
// only later, while a pod of the same workload that left before is still
// there, drained. The wait is for the pods the API server has deleting
// (the caller's among them): it holds until the new one drained, not
// just until the ones the watch shows are.
func TestWaitIsForThePodsBeingDeleted(t *testing.T) {
	t0 := time.Unix(1000, 0)
	clk := clocktesting.NewFakeClock(t0)
	old := podwatch.Leaving{Pod: podwatch.Pod{Namespace: "shop", Workload: "cart", UID: "old"}, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.5")}, Since: t0}
	pods := &fakePods{l: []podwatch.Leaving{old}, alive: map[types.UID]bool{"new": true}}
	deleting := func(_ context.Context, ns, workload string) ([]types.UID, error) {
		if ns != "shop" || workload != "cart" {
			t.Errorf("listed %s/%s, want shop/cart", ns, workload)
		}
		return []types.UID{"old", "new", "finished"}, nil // finished: deleted before the wait, no longer there
	}
	d := New(noKernel{}, pods, noConns{}, Options{Clock: clk, MinWait: time.Second, Deleting: deleting})
	for range 5 { // the old pod drains
		clk.Step(500 * time.Millisecond)
		d.Round()
	}
	if !d.states["old"].done {
		t.Fatal("the pod that left first is not drained after 2.5 s")
	}
	done := make(chan Result, 1)
	go func() { done <- d.Wait(context.Background(), "shop", "cart", 2*time.Second) }()
	// The watch shows the new pod leaving two rounds later; it drains
	// MinWait after its deletion.
	var answeredAt time.Duration
	for at := 500 * time.Millisecond; at <= 5*time.Second && answeredAt == 0; at += 500 * time.Millisecond {
		time.Sleep(20 * time.Millisecond) // the wait is in
		if at == time.Second {
			pods.set(old, podwatch.Leaving{Pod: podwatch.Pod{Namespace: "shop", Workload: "cart", UID: "new"}, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.6")}, Since: clk.Now()})
		}
		clk.Step(500 * time.Millisecond)
		d.Round()
		select {
		case r := <-done:
			answeredAt = at
			if r.Pods != 3 || r.Drained != 3 {
				t.Errorf("answered %+v, want 3 pods, 3 drained (or gone)", r)
			}
		case <-time.After(200 * time.Millisecond):
		}
	}
	if answeredAt != 2*time.Second {
		t.Errorf("the wait answered at %v, want 2s: when the pod deleted at 1s drained (MinWait 1s)", answeredAt)
	}
	// Nothing being deleted (a container restarted for its liveness
	// probe): at once.
	d.opts.Deleting = func(context.Context, string, string) ([]types.UID, error) { return nil, nil }
	if r := d.Wait(context.Background(), "shop", "cart", 2*time.Second); r.Pods != 0 {
		t.Errorf("none being deleted: %+v, want 0 pods", r)
	}
}

// fakeEndpoints says what the test sets of every address.
type fakeEndpoints struct {
	mu sync.Mutex
	st endpointwatch.State
}

func (e *fakeEndpoints) Of(string, netip.Addr) endpointwatch.State {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.st
}

// TestHeldWhileAnEndpointSliceListsIt: a pod some EndpointSlice still
// lists as ready (the public Service's mirror not yet updated, say) gets
// new connections from kube-proxy whatever the kernel saw so far: it is
// held until no slice lists it, then MinWait more.
func TestHeldWhileAnEndpointSliceListsIt(t *testing.T) {
	t0 := time.Unix(1000, 0)
	clk := clocktesting.NewFakeClock(t0)
	pods := &fakePods{l: []podwatch.Leaving{{Pod: podwatch.Pod{Namespace: "shop", Workload: "cart", UID: "u1"}, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.5")}, Since: t0}}}
	ep := &fakeEndpoints{st: endpointwatch.State{Known: true, Routed: true, Slices: []string{"shop/cart-public-1"}}}
	d := New(noKernel{}, pods, noConns{}, Options{Clock: clk, MinWait: time.Second, Endpoints: ep})
	var doneAt time.Duration
	for at := time.Duration(0); at <= 10*time.Second && doneAt == 0; at += 500 * time.Millisecond {
		clk.SetTime(t0.Add(at))
		if at == 3*time.Second {
			ep.mu.Lock()
			ep.st = endpointwatch.State{Known: true, Since: clk.Now()}
			ep.mu.Unlock()
		}
		d.Round()
		if d.states["u1"].done {
			doneAt = at
		}
	}
	if doneAt != 4*time.Second {
		t.Errorf("drained at %v, want 4s: MinWait (1s) after the last slice stopped listing it (3s)", doneAt)
	}
	// Slices not known yet (the watch has not listed, or may not): the
	// deletion alone starts MinWait.
	pods.set(podwatch.Leaving{Pod: podwatch.Pod{Namespace: "shop", Workload: "cart", UID: "u2"}, IPs: []netip.Addr{netip.MustParseAddr("10.0.0.6")}, Since: clk.Now()})
	ep.st = endpointwatch.State{Routed: true}
	for range 3 { // MinWait, and Quiet (1 s) from its first round

		clk.Step(500 * time.Millisecond)
		d.Round()
	}
	if !d.states["u2"].done {
		t.Error("slices unknown: not drained 1.5 s after the deletion")
	}
}
