package drain

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

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
func TestDrainedWhenTheKernelIsQuiet(t *testing.T) {
	t0 := time.Unix(1000, 0)
	clk := clocktesting.NewFakeClock(t0)
	ip := netip.MustParseAddr("10.0.0.5")
	pods := &fakePods{l: []podwatch.Leaving{{Pod: podwatch.Pod{Namespace: "shop", Workload: "cart", UID: "u1"}, IP: ip, Since: t0}}}
	k := &countingKernel{ip: ip}
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
