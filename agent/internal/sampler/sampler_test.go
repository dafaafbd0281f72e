package sampler

import (
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sockscale/sockscale/agent/internal/podwatch"
	"github.com/sockscale/sockscale/bpf"
	"github.com/sockscale/sockscale/internal/stats"
)

type scripted struct{ snaps []bpf.Snapshot }

func (s *scripted) Snapshot() (bpf.Snapshot, error) {
	snap := s.snaps[0]
	s.snaps = s.snaps[1:]
	return snap, nil
}
func (s *scripted) Events() (bpf.Events, error) { return bpf.Events{}, nil }

type pods map[netip.Addr]podwatch.Pod

func (p pods) Lookup(ip netip.Addr) (podwatch.Pod, bool) { v, ok := p[ip]; return v, ok }

type nopRecorder struct{}

func (nopRecorder) ObserveSnapshot(time.Duration) {}
func (nopRecorder) Error(string)                  {}

var web = netip.MustParseAddr("10.0.0.5")

func counters(started, completed uint64, area time.Duration, opaque uint64) bpf.PodCounters {
	return bpf.PodCounters{
		Requests:         bpf.RequestCounters{InFlight: int64(started - completed), Started: started, Completed: completed, Area: area},
		OpaqueConnsTotal: opaque,
	}
}

func TestPeriodAverages(t *testing.T) {
	src := &scripted{snaps: []bpf.Snapshot{
		{At: 10 * time.Second, Pods: map[netip.Addr]bpf.PodCounters{web: counters(10, 8, 3*time.Second, 0)}},
		// 2 s later: 2.5 request-seconds more (1.25 in flight on average), 7 completed.
		{At: 12 * time.Second, Pods: map[netip.Addr]bpf.PodCounters{web: counters(16, 15, 5500*time.Millisecond, 0)}},
		// Counters reset (address reused): averages from zero; one opaque connection.
		{At: 13 * time.Second, Pods: map[netip.Addr]bpf.PodCounters{web: counters(2, 1, 500*time.Millisecond, 1)}},
	}}
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	s := New(src, pods{web: {Namespace: "ns", Name: "web-1", Workload: "web"}}, Options{
		Node: "node-a", Period: time.Second, Clock: clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Recorder: nopRecorder{},
	})
	if err := s.SampleOnce(); err != nil {
		t.Fatal(err)
	}
	if b := s.Latest().Batch; b != nil {
		t.Errorf("first sample has a batch %+v; there is no period yet", b)
	}
	clk.Step(2 * time.Second)
	if err := s.SampleOnce(); err != nil {
		t.Fatal(err)
	}
	want := &stats.Batch{Node: "node-a", Start: time.Unix(1000, 0), Period: 2 * time.Second, Pods: []stats.PodStat{
		{IP: web, Namespace: "ns", Pod: "web-1", Workload: "web", Concurrency: 1.25, Requests: 7},
	}}
	if diff := cmp.Diff(want, s.Latest().Batch, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("batch (-want +got):\n%s", diff)
	}
	if m := s.Latest().Pods[0].Mode; m != ModeHTTP {
		t.Errorf("mode = %s, want http", m)
	}
	clk.Step(time.Second)
	if err := s.SampleOnce(); err != nil {
		t.Fatal(err)
	}
	got := s.Latest()
	if st := got.Batch.Pods[0]; st.Concurrency != 0.5 || st.Requests != 1 || st.Accounting != stats.AccountingConnections {
		t.Errorf("after a reset: concurrency %v requests %d accounting %s, want 0.5, 1 and connections", st.Concurrency, st.Requests, st.Accounting)
	}
	if m := got.Pods[0].Mode; m != ModeConnection {
		t.Errorf("mode = %s after an opaque connection, want connection", m)
	}
}

// TestDualStackPodIsOnePod: a dual-stack pod's two addresses, counted
// apart in the kernel, are one sample and one record, by the address the
// pod goes by: its requests and concurrencies summed, its accounting the
// coarser; an address first seen later starts its period from zero.
func TestDualStackPodIsOnePod(t *testing.T) {
	v6 := netip.MustParseAddr("fd5c:a1e:0:1::5")
	h2 := counters(4, 4, 2*time.Second, 0)
	h2.H2ConnsTotal = 1
	src := &scripted{snaps: []bpf.Snapshot{
		{At: 10 * time.Second, Pods: map[netip.Addr]bpf.PodCounters{web: counters(10, 8, 3*time.Second, 0)}},
		// 2 s later: IPv4 1.25 in flight on average and 7 completed; IPv6
		// new, over HTTP/2: 1 in flight on average, 4 completed.
		{At: 12 * time.Second, Pods: map[netip.Addr]bpf.PodCounters{web: counters(16, 15, 5500*time.Millisecond, 0), v6: h2}},
	}}
	pod := podwatch.Pod{Namespace: "ns", Name: "web-1", Workload: "web", UID: "u1", IP: web}
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	s := New(src, pods{web: pod, v6: pod}, Options{
		Node: "node-a", Period: time.Second, Clock: clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Recorder: nopRecorder{},
	})
	for range 2 {
		if err := s.SampleOnce(); err != nil {
			t.Fatal(err)
		}
		clk.Step(2 * time.Second)
	}
	got := s.Latest()
	want := []stats.PodStat{{IP: web, Namespace: "ns", Pod: "web-1", Workload: "web", Concurrency: 2.25, Requests: 11, Accounting: stats.AccountingHTTP2Streams}}
	if diff := cmp.Diff(want, got.Batch.Pods, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("records (-want +got):\n%s", diff)
	}
	if len(got.Pods) != 1 || got.Pods[0].IP != web || got.Pods[0].Counters.Requests.Completed != 19 || got.Pods[0].Mode != ModeHTTP2 {
		t.Errorf("samples = %+v, want one of %s with 19 completed, http2", got.Pods, web)
	}
}

// TestModeHTTP2: a pod with a connection followed as HTTP/2 in the period
// (open, or opened and closed within it) is in mode http2; one with a
// connection at connection level is in mode connection, whatever else it
// has; neither, http.
func TestModeHTTP2(t *testing.T) {
	h2 := func(inFlight int64, total, opaque uint64) bpf.PodCounters {
		c := counters(5, 5, time.Second, opaque)
		c.H2ConnsInFlight, c.H2ConnsTotal = inFlight, total
		return c
	}
	steps := []struct {
		c    bpf.PodCounters
		want string
	}{
		{h2(0, 0, 0), ModeHTTP},
		{h2(1, 1, 0), ModeHTTP2},
		{h2(0, 2, 0), ModeHTTP2}, // one more opened and closed within the period
		{h2(1, 3, 1), ModeConnection},
		{h2(0, 3, 1), ModeHTTP},
	}
	var cs []bpf.PodCounters
	for _, st := range steps {
		cs = append(cs, st.c)
	}
	s, clk := webSampler(cs)
	for i, st := range steps {
		if err := s.SampleOnce(); err != nil {
			t.Fatal(err)
		}
		if m := s.Latest().Pods[0].Mode; m != st.want {
			t.Errorf("step %d (%+v): mode %s, want %s", i, st.c, m, st.want)
		}
		clk.Step(time.Second)
	}
}

// TestAccounting: each pod's record says how it was counted, and for a pod
// counted per connection the mean of its opaque connections at the
// period's two ends, at most its concurrency.
func TestAccounting(t *testing.T) {
	// opaque and h2 are connections in flight and opened so far; area the
	// request-seconds so far (one snapshot a second).
	at := func(area time.Duration, opaqueInFlight int64, opaqueTotal uint64, h2InFlight int64) bpf.PodCounters {
		c := counters(10, 10, area, opaqueTotal)
		c.OpaqueConnsInFlight, c.H2ConnsInFlight = opaqueInFlight, h2InFlight
		return c
	}
	steps := []struct {
		name       string
		c          bpf.PodCounters
		want       stats.Accounting
		wantOpaque float64
	}{
		{"first sample", at(0, 0, 0, 0), 0, 0},
		{"HTTP/1 only", at(2*time.Second, 0, 0, 0), stats.AccountingHTTP1Requests, 0},
		{"an h2c connection", at(5*time.Second, 0, 0, 1), stats.AccountingHTTP2Streams, 0},
		// Two TLS connections opened in the period, open at its end:
		// (0+2)/2 = 1 of the 3 in flight.
		{"TLS connections open", at(8*time.Second, 2, 2, 1), stats.AccountingConnections, 1},
		// Both open through the period: 2 of 2.
		{"TLS connections through", at(10*time.Second, 2, 2, 0), stats.AccountingConnections, 2},
		// Closed in the period: (2+0)/2 = 1, capped at the 0.5 in flight.
		{"TLS connections closed", at(10500*time.Millisecond, 0, 2, 0), stats.AccountingConnections, 0.5},
		// None open at either end, none opened: back to HTTP/1.
		{"no more TLS", at(11*time.Second, 0, 2, 0), stats.AccountingHTTP1Requests, 0},
		// One opened and closed within the period: counted per connection,
		// its time missed by the estimate.
		{"a short TLS connection", at(12*time.Second, 0, 3, 0), stats.AccountingConnections, 0},
	}
	var cs []bpf.PodCounters
	for _, st := range steps {
		cs = append(cs, st.c)
	}
	s, clk := webSampler(cs)
	for i, st := range steps {
		if err := s.SampleOnce(); err != nil {
			t.Fatal(err)
		}
		clk.Step(time.Second)
		if i == 0 {
			continue
		}
		got := s.Latest().Batch.Pods[0]
		if got.Accounting != st.want || got.OpaqueConcurrency != st.wantOpaque {
			t.Errorf("%s: accounting %s, opaque concurrency %v (of %v); want %s, %v", st.name, got.Accounting, got.OpaqueConcurrency, got.Concurrency, st.want, st.wantOpaque)
		}
	}
}

// webSampler samples pod web-1 at address web, whose counters read cs, one
// snapshot a second; its clock is at the first.
func webSampler(cs []bpf.PodCounters) (*Sampler, *clocktesting.FakeClock) {
	src := &scripted{}
	for i, c := range cs {
		src.snaps = append(src.snaps, bpf.Snapshot{At: time.Duration(i+1) * time.Second, Pods: map[netip.Addr]bpf.PodCounters{web: c}})
	}
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	s := New(src, pods{web: {Namespace: "ns", Name: "web-1", Workload: "web"}}, Options{
		Node: "node-a", Period: time.Second, Clock: clk, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Recorder: nopRecorder{},
	})
	return s, clk
}
