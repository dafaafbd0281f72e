package readiness

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus/testutil"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/sockscale/sockscale/activator/internal/target"
)

var (
	// addrs lets cmp compare addresses (their fields are unexported).
	addrs = cmpopts.EquateComparable(netip.AddrPort{})
	hello = target.Key{Namespace: "default", Name: "hello"}
	t0    = time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
)

// sink records what the prober pushes.
type sink struct {
	mu     sync.Mutex
	pushes [][]netip.AddrPort
	ch     chan []netip.AddrPort
}

func newSink() *sink { return &sink{ch: make(chan []netip.AddrPort, 100)} }

func (s *sink) SetPods(_ target.Key, ready []netip.AddrPort) {
	s.mu.Lock()
	s.pushes = append(s.pushes, ready)
	s.mu.Unlock()
	s.ch <- ready
}

func (s *sink) next(t *testing.T) []netip.AddrPort {
	t.Helper()
	select {
	case r := <-s.ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no ready set pushed")
		return nil
	}
}

func (s *sink) none(t *testing.T) {
	t.Helper()
	select {
	case r := <-s.ch:
		t.Fatalf("pushed %v, want nothing", r)
	default:
	}
}

// backend is a pod: it answers probes with the status in code and
// reports each probe's User-Agent on seen.
type backend struct {
	*httptest.Server
	code atomic.Int32
	seen chan string
}

func newBackend(t *testing.T, code int) *backend {
	b := &backend{seen: make(chan string, 100)}
	b.code.Store(int32(code))
	b.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(int(b.code.Load()))
		b.seen <- r.UserAgent()
	}))
	t.Cleanup(b.Close)
	return b
}

func (b *backend) addr() netip.AddrPort { return netip.MustParseAddrPort(b.Listener.Addr().String()) }

func (b *backend) probed(t *testing.T) {
	t.Helper()
	select {
	case ua := <-b.seen:
		if !strings.HasPrefix(ua, "sockscale-probe/") {
			t.Errorf("probe User-Agent %q does not start with sockscale-probe/", ua)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no probe arrived")
	}
}

func TestSliceReadyNeedsNoProbe(t *testing.T) {
	b := newBackend(t, http.StatusOK)
	s := newSink()
	p := New(Options{Sink: s, Clock: testingclock.NewFakeClock(t0)})
	defer p.Close()

	p.SetPods(hello, []Pod{{Addr: b.addr(), Ready: true}})
	if diff := cmp.Diff([]netip.AddrPort{b.addr()}, s.next(t), addrs); diff != "" {
		t.Errorf("ready set (-want +got):\n%s", diff)
	}
	// Unready after ready: the kubelet saw it fail. Not ready, not probed.
	p.SetPods(hello, []Pod{{Addr: b.addr(), Ready: false}})
	if got := s.next(t); len(got) != 0 {
		t.Errorf("ready set = %v, want empty", got)
	}
	p.SetPods(hello, []Pod{{Addr: b.addr(), Ready: false}})
	s.none(t) // unchanged: not pushed again
	p.Close()
	if len(b.seen) != 0 {
		t.Errorf("%d probes sent to a pod its EndpointSlice had called ready", len(b.seen))
	}
}

// TestProbeUntilItAnswers follows one pod's start on the probe clock:
//
//	t0        EndpointSlice lists it not ready; probe 1 at once: 503
//	t0+25ms   probe 2: 503
//	t0+50ms   the pod serves; probe 3: 200 -> ready, pushed; probing stops
func TestProbeUntilItAnswers(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	b := newBackend(t, http.StatusServiceUnavailable)
	s := newSink()
	p := New(Options{Sink: s, Clock: clk})
	defer p.Close()

	p.SetPods(hello, []Pod{{Addr: b.addr()}})
	if got := s.next(t); len(got) != 0 {
		t.Fatalf("first set = %v, want empty", got)
	}
	b.probed(t)
	clk.Step(DefaultPeriod)
	b.probed(t)
	s.none(t)
	b.code.Store(http.StatusOK)
	clk.Step(DefaultPeriod)
	b.probed(t)
	if diff := cmp.Diff([]netip.AddrPort{b.addr()}, s.next(t), addrs); diff != "" {
		t.Errorf("ready set (-want +got):\n%s", diff)
	}
	clk.Step(DefaultPeriod)
	clk.Step(DefaultPeriod)
	p.Close() // waits for the probe goroutine, which ended
	if n := len(b.seen); n != 0 {
		t.Errorf("%d probes after the pod was ready", n)
	}
	if got := testutil.ToFloat64(p.m.probes.WithLabelValues(resultNotReady)); got != 2 {
		t.Errorf("not_ready probes = %v, want 2", got)
	}
	if got := testutil.ToFloat64(p.m.probedReady.WithLabelValues("default", "hello")); got != 1 {
		t.Errorf("pods probed ready = %v, want 1", got)
	}

	// The EndpointSlice catches up, then says not ready: the kubelet wins.
	p2 := New(Options{Sink: s, Clock: clk})
	defer p2.Close()
	b.code.Store(http.StatusOK)
	p2.SetPods(hello, []Pod{{Addr: b.addr()}})
	s.next(t) // empty
	b.probed(t)
	s.next(t) // ready by probe
	p2.SetPods(hello, []Pod{{Addr: b.addr(), Ready: true}})
	s.none(t)
	p2.SetPods(hello, []Pod{{Addr: b.addr(), Ready: false}})
	if got := s.next(t); len(got) != 0 {
		t.Errorf("after ready then unready by the slice: %v, want empty", got)
	}
}

func TestStatusMeansServing(t *testing.T) {
	tests := []struct {
		code  int
		ready bool
	}{
		{http.StatusOK, true},
		{http.StatusNotFound, true}, // the application answers, just not on /
		{http.StatusFound, true},    // not followed
		{http.StatusInternalServerError, false},
		{http.StatusServiceUnavailable, false},
	}
	for _, tt := range tests {
		b := newBackend(t, tt.code)
		p := New(Options{Sink: newSink()})
		if got := p.probe(t.Context(), b.URL+"/"); got != tt.ready {
			t.Errorf("status %d: ready = %v, want %v", tt.code, got, tt.ready)
		}
		p.Close()
	}
}

func TestProbeTimeout(t *testing.T) {
	// A pod that accepts and never answers: each probe ends at its timeout.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p := New(Options{Sink: newSink(), Timeout: 20 * time.Millisecond})
	defer p.Close()
	start := time.Now()
	if p.probe(t.Context(), "http://"+ln.Addr().String()+"/") {
		t.Error("a silent pod probed ready")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("probe took %v with a 20ms timeout", d)
	}
	if got := testutil.ToFloat64(p.m.probes.WithLabelValues(resultError)); got != 1 {
		t.Errorf("error probes = %v, want 1", got)
	}
}

func TestRemovedPodsStopBeingProbed(t *testing.T) {
	// Nothing listens there: every probe is refused at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := netip.MustParseAddrPort(ln.Addr().String()).Port()
	ln.Close()

	clk := testingclock.NewFakeClock(t0)
	s := newSink()
	p := New(Options{Sink: s, Clock: clk})
	var pods []Pod
	for i := range 50 {
		pods = append(pods, Pod{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 1, byte(i + 1)}), port)})
	}
	p.SetPods(hello, pods)
	p.SetPods(target.Key{Namespace: "other", Name: "x"}, pods[:1])
	// Counted by the prober itself: the process's goroutine count also
	// moves with other tests' servers winding down.
	if n := p.loops.Load(); n != 51 {
		t.Fatalf("%d probe loops, want one for each of the 51 pods", n)
	}
	clk.Step(DefaultPeriod)
	p.SetPods(hello, nil)
	p.Delete(target.Key{Namespace: "other", Name: "x"})
	deadline := time.Now().Add(10 * time.Second)
	for p.loops.Load() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d probe loops left after their pods were removed", p.loops.Load())
		}
		time.Sleep(time.Millisecond)
	}
	p.Close()
	p.SetPods(hello, pods) // after Close: ignored, starts nothing
	if n := p.loops.Load(); n != 0 {
		t.Errorf("SetPods after Close started %d probe loops", n)
	}
}

// TestUnreachableUntilItAnswers: a pod its EndpointSlice calls ready but
// that refused a forward leaves the ready set at once and comes back when
// it answers a probe; the slice staying ready does not bring it back.
func TestUnreachableUntilItAnswers(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	b := newBackend(t, http.StatusServiceUnavailable)
	s := newSink()
	p := New(Options{Sink: s, Clock: clk})
	defer p.Close()

	p.SetPods(hello, []Pod{{Addr: b.addr(), Ready: true}})
	s.next(t) // ready by its slice, not probed
	p.Unreachable(hello, b.addr())
	if got := s.next(t); len(got) != 0 {
		t.Fatalf("after Unreachable: %v, want empty", got)
	}
	b.probed(t) // 503: still out
	p.SetPods(hello, []Pod{{Addr: b.addr(), Ready: true}})
	s.none(t)
	p.Unreachable(hello, b.addr()) // told again while probing: nothing new
	s.none(t)
	b.code.Store(http.StatusOK)
	clk.Step(DefaultPeriod)
	b.probed(t)
	if diff := cmp.Diff([]netip.AddrPort{b.addr()}, s.next(t), addrs); diff != "" {
		t.Errorf("ready set after it answered (-want +got):\n%s", diff)
	}
	p.Unreachable(hello, netip.MustParseAddrPort("10.9.9.9:80")) // unknown pod: ignored
	p.Unreachable(target.Key{Namespace: "x", Name: "y"}, b.addr())
	s.none(t)
}
