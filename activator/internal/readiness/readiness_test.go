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
	"k8s.io/utils/clock"
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
	b := &backend{seen: make(chan string, 1000)} // a fast phase sends 67
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
		if got := p.probe(t.Context(), p.client, b.URL+"/"); got != tt.ready {
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
	if p.probe(t.Context(), p.client, "http://"+ln.Addr().String()+"/") {
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

// refused is an address nothing listens on: every probe is refused at once.
func refused(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close()
	return addr
}

// timerClock counts the timers made: a probe loop makes one before each
// probe.
type timerClock struct {
	*testingclock.FakeClock
	timers atomic.Int64
}

func (c *timerClock) NewTimer(d time.Duration) clock.Timer {
	c.timers.Add(1)
	return c.FakeClock.NewTimer(d)
}

// probeClock drives one probe loop on a fake clock and records when (on
// that clock, from its start) each probe was sent. The loop's timer is the
// clock's only waiter, so a step fired it if it left no waiter or the loop
// already made the next timer; the next probe is then counted before
// stepping on.
type probeClock struct {
	t      *testing.T
	clk    *timerClock
	p      *Prober
	start  time.Time
	n      float64 // probes counted
	timers int64   // timers counted
	at     []time.Duration
}

func newTimerClock() *timerClock { return &timerClock{FakeClock: testingclock.NewFakeClock(t0)} }

func newProbeClock(t *testing.T, clk *timerClock, p *Prober) *probeClock {
	return &probeClock{t: t, clk: clk, p: p, start: clk.Now()}
}

func (c *probeClock) sent() float64 {
	var n float64
	for _, r := range []string{resultReady, resultNotReady, resultError} {
		n += testutil.ToFloat64(c.p.m.probes.WithLabelValues(r))
	}
	return n
}

// probe waits for the next probe, sent without the clock moving.
func (c *probeClock) probe() {
	c.t.Helper()
	c.n++
	c.timers++
	deadline := time.Now().Add(10 * time.Second)
	for c.sent() < c.n || c.clk.timers.Load() < c.timers {
		if time.Now().After(deadline) {
			c.t.Fatalf("no probe %d at %v", len(c.at)+1, c.clk.Since(c.start))
		}
		time.Sleep(20 * time.Microsecond)
	}
	c.at = append(c.at, c.clk.Since(c.start))
}

// run steps the clock by 1 ms for d, counting the probes sent.
func (c *probeClock) run(d time.Duration) {
	c.t.Helper()
	for end := c.clk.Since(c.start) + d; c.clk.Since(c.start) < end; {
		c.clk.Step(time.Millisecond)
		if !c.clk.HasWaiters() || c.clk.timers.Load() > c.timers {
			c.probe()
		}
	}
}

// between counts the probes sent in [from, to).
func (c *probeClock) between(from, to time.Duration) int {
	n := 0
	for _, at := range c.at {
		if at >= from && at < to {
			n++
		}
	}
	return n
}

// intervals are the waits between probes sent in [from, to), each with
// the time of the probe it follows.
func (c *probeClock) intervals(from, to time.Duration) (after, wait []time.Duration) {
	for i := 1; i < len(c.at); i++ {
		if c.at[i-1] >= from && c.at[i-1] < to {
			after, wait = append(after, c.at[i-1]), append(wait, c.at[i]-c.at[i-1])
		}
	}
	return after, wait
}

// TestNobodyWaitingBacksOff: a pod that never listens, with no request
// held for its target, is probed every 15 ms for its first second, then
// ever more slowly up to every 5 s: ~87 probes in its first minute and 12
// in each after, where every 15 ms made 4,000 a minute.
func TestNobodyWaitingBacksOff(t *testing.T) {
	clk := newTimerClock()
	p := New(Options{Sink: newSink(), Clock: clk})
	defer p.Close()
	c := newProbeClock(t, clk, p)
	p.SetPods(hello, []Pod{{Addr: refused(t)}})
	c.probe()
	c.run(2 * time.Minute)

	after, wait := c.intervals(DefaultFastFor, 2*time.Minute)
	for i := 1; i < len(wait); i++ {
		if want := min(2*wait[i-1], DefaultMaxPeriod); wait[i] != want {
			t.Fatalf("after the probe at %v: waited %v, want %v (twice the last, at most %v)", after[i], wait[i], want, DefaultMaxPeriod)
		}
	}
	if len(wait) == 0 || wait[len(wait)-1] != DefaultMaxPeriod {
		t.Errorf("last waits %v, want them at the cap %v", wait[max(0, len(wait)-3):], DefaultMaxPeriod)
	}
	if n := c.between(0, time.Minute); n < 60 || n > 100 {
		t.Errorf("%d probes in the pod's first minute, want ~87 (67 in the fast first second)", n)
	}
	if n := c.between(time.Minute, 2*time.Minute); n > 13 {
		t.Errorf("%d probes in its second minute, want 12 (one every %v)", n, DefaultMaxPeriod)
	}
}

// TestNewPodProbedFast: for DefaultFastFor after a pod appears, or after
// the activator could not reach it, it is probed every 15 ms; then it
// slows down.
func TestNewPodProbedFast(t *testing.T) {
	clk := newTimerClock()
	b := newBackend(t, http.StatusServiceUnavailable)
	s := newSink()
	p := New(Options{Sink: s, Clock: clk})
	defer p.Close()
	c := newProbeClock(t, clk, p)
	p.SetPods(hello, []Pod{{Addr: b.addr()}})
	c.probe()
	c.run(2 * time.Second)
	checkFast := func(from time.Duration) {
		t.Helper()
		after, wait := c.intervals(from, from+DefaultFastFor)
		if len(wait) < int(DefaultFastFor/DefaultPeriod) {
			t.Fatalf("%d probes in the fast phase from %v, want %d", len(wait), from, DefaultFastFor/DefaultPeriod)
		}
		for i, w := range wait {
			if w != DefaultPeriod {
				t.Fatalf("after the probe at %v: waited %v, want %v in the fast phase", after[i], w, DefaultPeriod)
			}
		}
		if _, w := c.intervals(from+DefaultFastFor, from+2*DefaultFastFor); len(w) < 2 || w[0] != 2*DefaultPeriod || w[1] != 4*DefaultPeriod {
			t.Errorf("waits after the fast phase from %v: %v, want %v, %v, ...", from, w, 2*DefaultPeriod, 4*DefaultPeriod)
		}
	}
	checkFast(0)

	// Ready by its slice, then unreachable: fast again from there.
	p.SetPods(hello, []Pod{{Addr: b.addr(), Ready: true}})
	for len(s.ch) > 0 {
		<-s.ch
	}
	from := c.clk.Since(c.start)
	p.Unreachable(hello, b.addr())
	c.probe()
	c.run(2 * time.Second)
	checkFast(from)
}

// TestWakeProbesAtOnce: a request held for the target brings a pod in its
// 5 s backoff back to 15 ms at once, for as long as DefaultLinger after;
// then it backs off again.
func TestWakeProbesAtOnce(t *testing.T) {
	clk := newTimerClock()
	p := New(Options{Sink: newSink(), Clock: clk})
	defer p.Close()
	c := newProbeClock(t, clk, p)
	p.SetPods(hello, []Pod{{Addr: refused(t)}})
	p.SetPods(target.Key{Namespace: "other", Name: "x"}, []Pod{{Addr: refused(t)}})
	c.probe()
	c.probe() // one each: two loops, so drive the clock by hand
	p.Delete(target.Key{Namespace: "other", Name: "x"})
	deadline := time.Now().Add(10 * time.Second)
	for p.loops.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the other target's loop did not end")
		}
		time.Sleep(time.Millisecond)
	}
	c.run(30 * time.Second)
	if _, w := c.intervals(20*time.Second, 30*time.Second); len(w) == 0 || w[len(w)-1] != DefaultMaxPeriod {
		t.Fatalf("waits before Wake %v, want %v", w, DefaultMaxPeriod)
	}

	p.Wake(target.Key{Namespace: "x", Name: "unknown"}) // ignored
	woke := c.clk.Since(c.start)
	p.Wake(hello)
	c.probe() // the clock did not move: sent at once
	if got := c.at[len(c.at)-1]; got != woke {
		t.Fatalf("probe at %v after Wake at %v, want at once", got, woke)
	}
	c.run(5 * time.Second)
	after, wait := c.intervals(woke, woke+DefaultLinger)
	for i, w := range wait {
		if w != DefaultPeriod {
			t.Fatalf("after the probe at %v: waited %v, want %v within %v of Wake", after[i], w, DefaultPeriod, DefaultLinger)
		}
	}
	if _, w := c.intervals(woke+DefaultLinger, woke+5*time.Second); len(w) < 2 || w[0] != 2*DefaultPeriod {
		t.Errorf("waits %v after the linger, want it backing off again", w)
	}
}

// TestWaitingKeepsItFast: requests held while the target has busy ready
// pods (no OnCold, so no Wake) are seen at the next probe, slow or not,
// and keep the pod at 15 ms while they are held.
func TestWaitingKeepsItFast(t *testing.T) {
	clk := newTimerClock()
	var waiting atomic.Bool
	p := New(Options{Sink: newSink(), Clock: clk, Waiting: func(k target.Key) bool { return k == hello && waiting.Load() }})
	defer p.Close()
	c := newProbeClock(t, clk, p)
	p.SetPods(hello, []Pod{{Addr: refused(t)}})
	c.probe()
	c.run(20 * time.Second)
	waiting.Store(true)
	from := c.clk.Since(c.start)
	c.run(20 * time.Second)
	after, wait := c.intervals(from, from+20*time.Second)
	// The wait in progress at Store ends at most DefaultMaxPeriod later,
	// then each probe sees the requests held.
	if len(after) < 2 || after[1]-from > DefaultMaxPeriod {
		t.Fatalf("probes after requests were held: %v", after)
	}
	for i := 1; i < len(wait); i++ {
		if wait[i] != DefaultPeriod {
			t.Fatalf("after the probe at %v with requests held: waited %v, want %v", after[i], wait[i], DefaultPeriod)
		}
	}
}
