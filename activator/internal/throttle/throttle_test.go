package throttle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/sockscale/sockscale/activator/internal/target"
)

var (
	hello = target.Key{Namespace: "default", Name: "hello"}
	t0    = time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
)

// pods returns n pod addresses 10.0.0.1:8080, 10.0.0.2:8080, ...
func pods(n int) []netip.AddrPort {
	a := make([]netip.AddrPort, n)
	for i := range a {
		a[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}), 8080)
	}
	return a
}

func newThrottler(t *testing.T, o Options, s Settings, ready ...netip.AddrPort) *Throttler {
	t.Helper()
	th := New(o)
	if err := th.Update(hello, s); err != nil {
		t.Fatal(err)
	}
	th.SetPods(hello, ready)
	return th
}

// waitFor polls cond: the requests it waits for park on channels the test
// cannot see, so their arrival in the queue is observed, not slept on.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// call is one Try running on its own goroutine; its fn holds the slot
// until release is closed.
type call struct {
	dest    chan netip.AddrPort
	release chan struct{}
	err     chan error
	cancel  context.CancelFunc
}

func start(th *Throttler, ctx context.Context, key target.Key) *call {
	ctx, cancel := context.WithCancel(ctx)
	c := &call{dest: make(chan netip.AddrPort, 1), release: make(chan struct{}), err: make(chan error, 1), cancel: cancel}
	go func() {
		defer cancel()
		c.err <- th.Try(ctx, key, func(s Slot) error {
			d := s.Dest
			c.dest <- d
			<-c.release
			return nil
		})
	}()
	return c
}

// startHeld starts a call and waits until it is the queue's nth request.
func startHeld(t *testing.T, th *Throttler, n int) *call {
	t.Helper()
	c := start(th, context.Background(), hello)
	waitFor(t, fmt.Sprintf("%d held", n), func() bool { return th.Held(hello) == n })
	return c
}

func (c *call) done(t *testing.T) error {
	t.Helper()
	select {
	case err := <-c.err:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Try did not return")
		return nil
	}
}

func (c *call) got(t *testing.T) netip.AddrPort {
	t.Helper()
	select {
	case d := <-c.dest:
		return d
	case err := <-c.err:
		t.Fatalf("Try returned %v before its fn ran", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no pod slot came")
	}
	return netip.AddrPort{}
}

func (c *call) waiting(t *testing.T) {
	t.Helper()
	select {
	case d := <-c.dest:
		t.Fatalf("got pod %v, want still held", d)
	default:
	}
}

// deadlineCtx ends with DeadlineExceeded when expire is called, so tests
// choose the instant a deadline passes instead of sleeping until it does.
type deadlineCtx struct {
	context.Context
	done chan struct{}
	once sync.Once
}

func newDeadlineCtx() *deadlineCtx {
	return &deadlineCtx{Context: context.Background(), done: make(chan struct{})}
}
func (c *deadlineCtx) Done() <-chan struct{} { return c.done }
func (c *deadlineCtx) expire()               { c.once.Do(func() { close(c.done) }) }
func (c *deadlineCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// activatorNames returns n activator pod names act-0, act-1, ...
func activatorNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("sockscale-activator-7d9f8-%d", i)
	}
	return names
}

func TestShare(t *testing.T) {
	const u = unlimited
	acts := activatorNames(3)
	pod := pods(1)[0]
	for _, tt := range []struct {
		name       string
		cc         int
		activators []string
		want       int
	}{
		{"one activator takes every slot", 3, acts[:1], 3},
		{"no activator list: every slot", 3, nil, 3},
		{"unlimited with several activators: every activator uses the pod", 0, acts, u},
	} {
		if got := share(tt.cc, pod, tt.activators, acts[0]); got != tt.want {
			t.Errorf("%s: share = %d, want %d", tt.name, got, tt.want)
		}
	}

	// cc 10 over 3 activators: 4/3/3, the 4 to the pod's first by hash.
	var got []int
	for _, a := range acts {
		got = append(got, share(10, pod, acts, a))
	}
	slices.Sort(got)
	if diff := cmp.Diff([]int{3, 3, 4}, got); diff != "" {
		t.Errorf("cc 10, 3 activators: slots (-want +got):\n%s", diff)
	}

	// The rule's promise, for every small case: the activators' slots at a
	// pod add up to exactly cc (never oversubscribed, nothing wasted), and
	// every activator gets cc/n of every pod.
	for cc := 1; cc <= 12; cc++ {
		for n := 1; n <= 6; n++ {
			for _, pod := range pods(7) {
				sum := 0
				for _, a := range activatorNames(n) {
					s := share(cc, pod, activatorNames(n), a)
					if s < cc/n || s > cc/n+1 {
						t.Errorf("cc %d, %d activators, pod %v: activator %s has %d slots, want %d or %d", cc, n, pod, a, s, cc/n, cc/n+1)
					}
					sum += s
				}
				if sum != cc {
					t.Errorf("cc %d, %d activators: pod %v has %d slots in all, want %d", cc, n, pod, sum, cc)
				}
			}
		}
	}
}

// TestShareSpreads checks that the hash spreads whole pods evenly: with cc
// 1 each pod goes to one activator, and over many pods each activator gets
// about its part.
func TestShareSpreads(t *testing.T) {
	const podCount = 3000
	all := make([]netip.AddrPort, podCount)
	for i := range all {
		all[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 8080)
	}
	for _, n := range []int{2, 3, 5} {
		acts := activatorNames(n)
		for _, a := range acts {
			owned := 0
			for _, p := range all {
				owned += share(1, p, acts, a)
			}
			// Binomial(3000, 1/n): 5 standard deviations either side.
			mean := float64(podCount) / float64(n)
			sd := math.Sqrt(mean * (1 - 1/float64(n)))
			if math.Abs(float64(owned)-mean) > 5*sd {
				t.Errorf("%d activators: %s owns %d of %d pods, want %.0f +- %.0f", n, a, owned, podCount, mean, 5*sd)
			}
		}
	}
}

// TestActivatorsWithDifferentViewsNeverOversubscribe is the case that
// broke the earlier split by the pods' sorted order: two activators see a
// different set of ready pods (each probes them itself, and one saw a new
// pod answer first). For every pod both use, their slots must still add up
// to at most cc. With the sorted-order split, a pod at index 0 for one
// activator and index 1 for the other went to both.
func TestActivatorsWithDifferentViewsNeverOversubscribe(t *testing.T) {
	acts := activatorNames(2)
	all := pods(12)
	r := rand.New(rand.NewPCG(3, 4))
	for cc := 1; cc <= 4; cc++ {
		for range 200 {
			viewA := slices.DeleteFunc(slices.Clone(all), func(netip.AddrPort) bool { return r.IntN(3) == 0 })
			viewB := slices.DeleteFunc(slices.Clone(all), func(netip.AddrPort) bool { return r.IntN(3) == 0 })
			a := newThrottlerAs(t, acts[0], acts, cc, viewA)
			b := newThrottlerAs(t, acts[1], acts, cc, viewB)
			slotsA, slotsB := assignedSlots(a), assignedSlots(b)
			for addr, sa := range slotsA {
				if sb := slotsB[addr]; sa+sb > cc {
					t.Fatalf("cc %d: pod %v gets %d slots from %s (view %v) and %d from %s (view %v)", cc, addr, sa, acts[0], viewA, sb, acts[1], viewB)
				}
			}
		}
	}
}

func newThrottlerAs(t *testing.T, self string, activators []string, cc int, ready []netip.AddrPort) *Throttler {
	t.Helper()
	return newThrottler(t, Options{Self: self}, Settings{ContainerConcurrency: cc, Activators: activators}, ready...)
}

// assignedSlots is the slots of each pod the throttler uses.
func assignedSlots(th *Throttler) map[netip.AddrPort]int {
	q := th.queue(hello)
	q.mu.Lock()
	defer q.mu.Unlock()
	got := map[netip.AddrPort]int{}
	for _, p := range q.assigned {
		got[p.addr] = p.slots
	}
	return got
}

func TestAssignment(t *testing.T) {
	all := pods(4)
	acts := activatorNames(3)
	// byShare is what share says for each pod, the expectation where the
	// hash decides.
	byShare := func(cc int, self string, activators []string, ready []netip.AddrPort) map[netip.AddrPort]int {
		m := map[netip.AddrPort]int{}
		for _, p := range ready {
			if s := share(cc, p, activators, self); s > 0 {
				m[p] = s
			}
		}
		return m
	}
	tests := []struct {
		name       string
		self       string
		activators []string
		cc         int
		ready      []netip.AddrPort
		want       map[netip.AddrPort]int // slots of the pods this activator uses
	}{
		{"second of two activators: the pods whose first it is", acts[1], []string{acts[1], acts[0]}, 1, all,
			byShare(1, acts[1], acts[:2], all)},
		{"not in the path: every pod, full cc", "act-z", acts[:2], 5, all[:2], map[netip.AddrPort]int{all[0]: 5, all[1]: 5}},
		{"no activator list: every pod", acts[0], nil, 1, all[:1], map[netip.AddrPort]int{all[0]: 1}},
		{"duplicate names count once", acts[1], []string{acts[0], acts[1], acts[1]}, 3, all[:2], byShare(3, acts[1], acts[:2], all[:2])},
		{"1 pod, 3 activators, cc 10: a third of the slots, or one more", acts[2], acts, 10, all[:1], byShare(10, acts[2], acts, all[:1])},
		{"unlimited: every pod", acts[0], acts, 0, all, map[netip.AddrPort]int{all[0]: unlimited, all[1]: unlimited, all[2]: unlimited, all[3]: unlimited}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			th := newThrottler(t, Options{Self: tt.self}, Settings{ContainerConcurrency: tt.cc, Activators: tt.activators}, tt.ready...)
			if diff := cmp.Diff(tt.want, assignedSlots(th)); diff != "" {
				t.Errorf("assigned slots (-want +got):\n%s", diff)
			}
		})
	}
	// The case above with cc 1 and 4 pods between 2 activators must give
	// each some, or the test says nothing about the split.
	if n := len(byShare(1, acts[1], acts[:2], all)); n == 0 || n == len(all) {
		t.Errorf("activator %s owns %d of 4 pods: pick pod addresses the hash splits", acts[1], n)
	}
}

func TestFreeSlotGoesAtOnce(t *testing.T) {
	th := newThrottler(t, Options{}, Settings{ContainerConcurrency: 1}, pods(1)...)
	var got netip.AddrPort
	if err := th.Try(context.Background(), hello, func(s Slot) error { got = s.Dest; return nil }); err != nil {
		t.Fatal(err)
	}
	if got != pods(1)[0] {
		t.Errorf("dest = %v, want %v", got, pods(1)[0])
	}
	fnErr := errors.New("pod said no")
	if err := th.Try(context.Background(), hello, func(Slot) error { return fnErr }); !errors.Is(err, fnErr) {
		t.Errorf("Try = %v, want fn's error", err)
	}
}

func TestHeldRequestsGoOldestFirst(t *testing.T) {
	th := newThrottler(t, Options{}, Settings{ContainerConcurrency: 1}, pods(1)...)
	first := start(th, context.Background(), hello)
	first.got(t)
	held := []*call{startHeld(t, th, 1), startHeld(t, th, 2), startHeld(t, th, 3)}

	close(first.release)
	for i, c := range held {
		c.got(t)
		for _, later := range held[i+1:] {
			later.waiting(t)
		}
		close(c.release)
		if err := c.done(t); err != nil {
			t.Fatal(err)
		}
	}
	if err := first.done(t); err != nil {
		t.Fatal(err)
	}
}

func TestHoldUntilAPodIsReady(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	var colds []target.Key
	var mu sync.Mutex
	th := newThrottler(t, Options{Clock: clk, OnCold: func(k target.Key) { mu.Lock(); colds = append(colds, k); mu.Unlock() }},
		Settings{ContainerConcurrency: 2})

	// t0: two requests arrive for a target at zero; only the first pokes.
	a := startHeld(t, th, 1)
	b := startHeld(t, th, 2)
	// t0+3.2s: the first pod answers its probe.
	clk.Step(3200 * time.Millisecond)
	th.SetPods(hello, pods(1))
	if got := a.got(t); got != pods(1)[0] {
		t.Errorf("a went to %v", got)
	}
	b.got(t)
	close(a.release)
	close(b.release)
	_, _ = a.done(t), b.done(t)

	mu.Lock()
	if diff := cmp.Diff([]target.Key{hello}, colds); diff != "" {
		t.Errorf("OnCold calls (-want +got):\n%s", diff)
	}
	mu.Unlock()
	m := th.m
	if got := testutil.ToFloat64(m.results.WithLabelValues("default", "hello", resultForwarded)); got != 2 {
		t.Errorf("forwarded = %v, want 2", got)
	}
	// One cold start of 3.2 s; both requests waited 3.2 s.
	wantHist := `
# HELP sockscale_activator_cold_start_duration_seconds Time from the first request held while a target had no ready pod to the first held request handed to a pod.
# TYPE sockscale_activator_cold_start_duration_seconds histogram
sockscale_activator_cold_start_duration_seconds_bucket{name="hello",namespace="default",le="2.5"} 0
sockscale_activator_cold_start_duration_seconds_bucket{name="hello",namespace="default",le="5"} 1
`
	if err := compareSubset(m.coldStart, wantHist); err != nil {
		t.Error(err)
	}
	if got := histSum(t, m.wait); got != 6.4 {
		t.Errorf("wait sum = %v s, want 6.4 (two requests held 3.2 s)", got)
	}

	// The target goes back to zero: the next request pokes again.
	th.SetPods(hello, nil)
	c := startHeld(t, th, 1)
	mu.Lock()
	if len(colds) != 2 {
		t.Errorf("OnCold called %d times, want 2 (a new cold start)", len(colds))
	}
	mu.Unlock()
	c.cancel()
	if err := c.done(t); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled request: %v", err)
	}
}

// compareSubset checks that every line of want appears in c's exposition.
func compareSubset(c prometheus.Collector, want string) error {
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		return err
	}
	got := exposition(reg)
	for _, line := range strings.Split(strings.TrimSpace(want), "\n") {
		if !strings.Contains(got, line) {
			return fmt.Errorf("metrics lack %q; have:\n%s", line, got)
		}
	}
	return nil
}

func exposition(g prometheus.Gatherer) string {
	mfs, err := g.Gather()
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, mf := range mfs {
		if _, err := expfmt.MetricFamilyToText(&b, mf); err != nil {
			return err.Error()
		}
	}
	return b.String()
}

func histSum(t *testing.T, h *prometheus.HistogramVec) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			sum += m.GetHistogram().GetSampleSum()
		}
	}
	return sum
}

func TestQueueFull(t *testing.T) {
	th := newThrottler(t, Options{QueueDepth: 2}, Settings{})
	a, b := startHeld(t, th, 1), startHeld(t, th, 2)
	err := th.Try(context.Background(), hello, func(Slot) error { t.Error("fn ran"); return nil })
	if !errors.Is(err, ErrQueueFull) || !strings.Contains(err.Error(), "default/hello already holds 2 requests, its queue depth") {
		t.Errorf("Try = %v, want ErrQueueFull naming the depth", err)
	}
	// A client that leaves frees its place at once.
	a.cancel()
	if err := a.done(t); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled: %v", err)
	}
	if got := th.Held(hello); got != 1 {
		t.Errorf("held after a cancel = %d, want 1", got)
	}
	c := startHeld(t, th, 2)
	for _, x := range []*call{b, c} {
		x.cancel()
		_ = x.done(t)
	}
	if got := testutil.ToFloat64(th.m.results.WithLabelValues("default", "hello", resultQueueFull)); got != 1 {
		t.Errorf("queue_full = %v, want 1", got)
	}
	if got := testutil.ToFloat64(th.m.inFlight.WithLabelValues("default", "hello", "held")); got != 0 {
		t.Errorf("held gauge = %v, want 0", got)
	}
}

func TestDeadlineSaysWhy(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	tests := []struct {
		name  string
		cc    int
		ready []netip.AddrPort
		busy  bool
		want  string
	}{
		{"no pod", 1, nil, false, "default/hello: held 5m0s and no pod of the target became ready"},
		{"pods busy", 1, pods(2), true, "held 5m0s and all 2 pods this activator uses stayed at their concurrency limit (containerConcurrency 1)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			th := newThrottler(t, Options{Clock: clk}, Settings{ContainerConcurrency: tt.cc}, tt.ready...)
			var busy []*call
			if tt.busy {
				for range tt.ready {
					c := start(th, context.Background(), hello)
					c.got(t)
					busy = append(busy, c)
				}
			}
			ctx := newDeadlineCtx()
			errc := make(chan error, 1)
			go func() { errc <- th.Try(ctx, hello, func(Slot) error { return nil }) }()
			waitFor(t, "held", func() bool { return th.Held(hello) == 1 })
			clk.Step(300 * time.Second)
			ctx.expire()
			err := <-errc
			if !errors.Is(err, ErrDeadline) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Try = %v, want ErrDeadline saying %q", err, tt.want)
			}
			if th.Held(hello) != 0 {
				t.Error("the expired request still holds its place")
			}
			for _, c := range busy {
				close(c.release)
				_ = c.done(t)
			}
		})
	}
}

func TestUnreadyPodFinishesButGetsNoMore(t *testing.T) {
	p := pods(2)
	th := newThrottler(t, Options{}, Settings{ContainerConcurrency: 1}, p[0])
	a := start(th, context.Background(), hello)
	a.got(t)
	// The pod leaves the ready set and comes back while a's request is
	// still at it: it must not get a second request (cc 1).
	th.SetPods(hello, nil)
	th.SetPods(hello, p[:1])
	b := startHeld(t, th, 1)
	// Another pod becomes ready: b goes there.
	th.SetPods(hello, p)
	if got := b.got(t); got != p[1] {
		t.Errorf("b went to %v, want %v", got, p[1])
	}
	close(a.release)
	close(b.release)
	_, _ = a.done(t), b.done(t)

	// Gone for good: once its request ends, nothing is kept of it.
	c := start(th, context.Background(), hello)
	dest := c.got(t)
	th.SetPods(hello, nil)
	q := th.queue(hello)
	q.mu.Lock()
	if _, ok := q.pods[dest]; !ok {
		t.Error("a pod with a request in flight was forgotten")
	}
	q.mu.Unlock()
	close(c.release)
	_ = c.done(t)
	q.mu.Lock()
	if len(q.pods) != 0 {
		t.Errorf("pods kept after they left and drained: %v", q.pods)
	}
	q.mu.Unlock()
}

func TestUnlimitedBalancesByLeastInFlight(t *testing.T) {
	// With two pods, power of two choices compares both: requests alternate.
	th := newThrottler(t, Options{}, Settings{ContainerConcurrency: 0}, pods(2)...)
	count := map[netip.AddrPort]int{}
	var calls []*call
	for range 10 {
		c := start(th, context.Background(), hello)
		count[c.got(t)]++
		calls = append(calls, c)
	}
	if diff := cmp.Diff(map[netip.AddrPort]int{pods(2)[0]: 5, pods(2)[1]: 5}, count); diff != "" {
		t.Errorf("requests per pod (-want +got):\n%s", diff)
	}
	for _, c := range calls {
		close(c.release)
		_ = c.done(t)
	}
}

func TestRemovedAndUnknownTargets(t *testing.T) {
	th := newThrottler(t, Options{}, Settings{ContainerConcurrency: 1})
	if err := th.Update(hello, Settings{ContainerConcurrency: -1}); err == nil || !strings.Contains(err.Error(), "containerConcurrency -1") {
		t.Errorf("Update(cc -1) = %v", err)
	}
	a := startHeld(t, th, 1)
	th.Delete(hello)
	if err := a.done(t); !errors.Is(err, ErrTargetRemoved) {
		t.Errorf("held request of a deleted target: %v, want ErrTargetRemoved", err)
	}
	if err := th.Try(context.Background(), hello, nil); !errors.Is(err, ErrUnknownTarget) {
		t.Errorf("Try after delete = %v, want ErrUnknownTarget", err)
	}
	th.SetPods(hello, pods(1)) // ignored: does not bring it back
	if th.queue(hello) != nil {
		t.Error("SetPods recreated a deleted target")
	}
	if n := testutil.CollectAndCount(th.m.results); n != 0 {
		t.Errorf("%d result series left for a deleted target", n)
	}
}

func TestPanicInFnFreesTheSlot(t *testing.T) {
	th := newThrottler(t, Options{}, Settings{ContainerConcurrency: 1}, pods(1)...)
	func() {
		defer func() { _ = recover() }()
		_ = th.Try(context.Background(), hello, func(Slot) error { panic("abort") })
	}()
	if err := th.Try(context.Background(), hello, func(Slot) error { return nil }); err != nil {
		t.Errorf("slot not freed after a panic: %v", err)
	}
}

// TestNeverMoreThanCC runs many requests through pods whose set keeps
// changing, with clients that give up at random, and checks that no pod
// ever has more than cc requests, that every place and slot is freed, and
// that no goroutine is left behind. Run with -race.
func TestNeverMoreThanCC(t *testing.T) {
	const cc, clients, perClient = 2, 64, 30
	before := runtime.NumGoroutine()
	all := pods(3)
	th := newThrottler(t, Options{QueueDepth: clients}, Settings{ContainerConcurrency: cc}, all...)
	var inFlight [3]atomic.Int32
	var over atomic.Int32
	var served, gaveUp atomic.Int32

	stop := make(chan struct{})
	churn := make(chan struct{})
	go func() { // pods leave and come back
		defer close(churn)
		r := rand.New(rand.NewPCG(1, 2))
		for {
			select {
			case <-stop:
				th.SetPods(hello, all)
				return
			default:
			}
			sub := slices.DeleteFunc(slices.Clone(all), func(netip.AddrPort) bool { return r.IntN(3) == 0 })
			th.SetPods(hello, sub)
			runtime.Gosched()
		}
	}()

	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(c), 7))
			for range perClient {
				ctx, cancel := context.WithCancel(context.Background())
				if r.IntN(4) == 0 {
					spins := r.IntN(50)
					go func() { // a client that leaves while held, or while served
						for range spins {
							runtime.Gosched()
						}
						cancel()
					}()
				}
				err := th.Try(ctx, hello, func(s Slot) error {
					d := s.Dest
					i := int(d.Addr().As4()[3]) - 1
					if n := inFlight[i].Add(1); n > cc {
						over.Add(1)
					}
					runtime.Gosched()
					inFlight[i].Add(-1)
					return nil
				})
				cancel()
				switch {
				case err == nil:
					served.Add(1)
				case errors.Is(err, context.Canceled):
					gaveUp.Add(1)
				default:
					t.Errorf("Try: %v", err)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-churn

	if n := over.Load(); n != 0 {
		t.Errorf("a pod had more than %d requests at once %d times", cc, n)
	}
	if served.Load()+gaveUp.Load() != clients*perClient {
		t.Errorf("served %d + gave up %d != %d", served.Load(), gaveUp.Load(), clients*perClient)
	}
	q := th.queue(hello)
	q.mu.Lock()
	for _, p := range q.pods {
		if p.inFlight != 0 {
			t.Errorf("pod %v keeps %d slots taken", p.addr, p.inFlight)
		}
	}
	if q.waiters.Len() != 0 {
		t.Errorf("%d places still taken", q.waiters.Len())
	}
	q.mu.Unlock()
	waitFor(t, "goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
	t.Logf("served %d, gave up %d", served.Load(), gaveUp.Load())
}

// TestUnreachablePodGoesToAnother: a pod that cannot be reached (nothing
// was sent) is taken out at once, the request goes to another pod, and the
// wiring is told so that the pod is probed until it answers again.
func TestUnreachablePodGoesToAnother(t *testing.T) {
	all := pods(2)
	var told []netip.AddrPort
	th := newThrottler(t, Options{OnUnreachable: func(k target.Key, a netip.AddrPort) { told = append(told, a) }},
		Settings{ContainerConcurrency: 1}, all...)
	var tried []netip.AddrPort
	err := th.Try(context.Background(), hello, func(s Slot) error {
		d := s.Dest
		tried = append(tried, d)
		if len(tried) == 1 {
			return fmt.Errorf("dial %v: %w", d, ErrPodUnreachable)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Try = %v, want served by the second pod", err)
	}
	if len(tried) != 2 || tried[0] == tried[1] {
		t.Fatalf("pods tried %v, want two different ones", tried)
	}
	if !slices.Equal([]netip.AddrPort{tried[0]}, told) {
		t.Errorf("OnUnreachable told %v, want [%v]", told, tried[0])
	}
	if got := assignedSlots(th); got[tried[0]] != 0 || got[tried[1]] != 1 {
		t.Errorf("assigned %v: want the unreachable pod %v out", got, tried[0])
	}
	th.SetPods(hello, all) // the prober saw it answer again
	if got := assignedSlots(th); len(got) != 2 {
		t.Errorf("assigned %v after the pod came back, want both", got)
	}
	if got := testutil.ToFloat64(th.m.results.WithLabelValues(hello.Namespace, hello.Name, resultUnreachable)); got != 1 {
		t.Errorf("pod_unreachable results = %v, want 1", got)
	}
	var wait dto.Metric
	if err := th.m.wait.WithLabelValues(hello.Namespace, hello.Name).(prometheus.Histogram).Write(&wait); err != nil {
		t.Fatal(err)
	}
	if n := wait.GetHistogram().GetSampleCount(); n != 1 {
		t.Errorf("%d wait samples for one request tried at two pods, want 1", n)
	}
}

// TestUnreachableLastPodHoldsAgain: with its only pod unreachable the
// request is held again (not failed) until a pod is ready.
func TestUnreachableLastPodHoldsAgain(t *testing.T) {
	p := pods(2)
	th := newThrottler(t, Options{}, Settings{ContainerConcurrency: 1}, p[0])
	done := make(chan error, 1)
	var tried []netip.AddrPort
	go func() {
		done <- th.Try(context.Background(), hello, func(s Slot) error {
			d := s.Dest
			tried = append(tried, d)
			if d == p[0] {
				return ErrPodUnreachable
			}
			return nil
		})
	}()
	waitFor(t, "the request held again", func() bool { return th.Held(hello) == 1 })
	th.SetPods(hello, p[1:])
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Try = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the held request was not handed to the new pod")
	}
	if !slices.Equal(p, tried) {
		t.Errorf("pods tried %v, want %v", tried, p)
	}
}

// TestUnreachableGivesUpAfterThreePods: every pod unreachable is a network
// fault; the request fails with fn's error instead of waiting out its
// deadline.
func TestUnreachableGivesUpAfterThreePods(t *testing.T) {
	th := newThrottler(t, Options{}, Settings{ContainerConcurrency: 1}, pods(5)...)
	attempts := 0
	err := th.Try(context.Background(), hello, func(s Slot) error {
		d := s.Dest
		attempts++
		return fmt.Errorf("dial %v: connection refused: %w", d, ErrPodUnreachable)
	})
	if !errors.Is(err, ErrPodUnreachable) || !strings.Contains(err.Error(), "3 pods in a row") {
		t.Errorf("Try = %v, want ErrPodUnreachable after 3 pods", err)
	}
	if attempts != maxUnreachable {
		t.Errorf("%d attempts, want %d", attempts, maxUnreachable)
	}
}

// A request held while its target had no ready pod is handed its slot as
// a cold start, with how long it waited; one that finds a free slot, or
// waits only for a busy pod's slot, is not.
func TestSlotSaysColdStart(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	th := newThrottler(t, Options{Clock: clk}, Settings{ContainerConcurrency: 1})
	slots := make(chan Slot, 3)
	release := make(chan struct{})
	try := func() {
		_ = th.Try(context.Background(), hello, func(s Slot) error { slots <- s; <-release; return nil })
	}
	go try()
	waitFor(t, "held at zero", func() bool { return th.Held(hello) == 1 })
	clk.Step(1500 * time.Millisecond)
	th.SetPods(hello, pods(1))
	if s := <-slots; !s.ColdStart || s.Waited != 1500*time.Millisecond || s.Dest != pods(1)[0] {
		t.Errorf("held through the cold start: %+v, want ColdStart after 1.5s at %v", s, pods(1)[0])
	}
	// The pod's one slot is taken: the next waits for it, not for a pod.
	go try()
	waitFor(t, "held for a busy pod", func() bool { return th.Held(hello) == 1 })
	clk.Step(time.Second)
	release <- struct{}{}
	if s := <-slots; s.ColdStart || s.Waited != time.Second {
		t.Errorf("held for a busy pod's slot: %+v, want no cold start, waited 1s", s)
	}
	release <- struct{}{}
	go try()
	if s := <-slots; s.ColdStart || s.Waited != 0 {
		t.Errorf("a free slot at once: %+v, want no cold start, no wait", s)
	}
	close(release)
}

// A target's own queue depth bounds it below the throttler's, and never
// above it (the activator's cap); 0 is the throttler's.
func TestQueueDepthPerTarget(t *testing.T) {
	for _, tc := range []struct {
		name        string
		own, global int
		want        int
	}{
		{"own below the activator's", 2, 5, 2},
		{"own above the activator's is capped", 9, 3, 3},
		{"unset is the activator's", 0, 4, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			th := newThrottler(t, Options{QueueDepth: tc.global}, Settings{QueueDepth: tc.own})
			var held []*call
			for i := range tc.want {
				held = append(held, startHeld(t, th, i+1))
			}
			err := th.Try(context.Background(), hello, func(Slot) error { t.Error("fn ran"); return nil })
			if want := fmt.Sprintf("already holds %d requests, its queue depth", tc.want); !errors.Is(err, ErrQueueFull) || !strings.Contains(err.Error(), want) {
				t.Errorf("request %d: %v, want ErrQueueFull saying %q", tc.want+1, err, want)
			}
			for _, c := range held {
				c.cancel()
				_ = c.done(t)
			}
		})
	}
	th := newThrottler(t, Options{}, Settings{})
	if err := th.Update(hello, Settings{QueueDepth: -1}); err == nil || !strings.Contains(err.Error(), "queue depth -1: must be 0") {
		t.Errorf("Update with depth -1: %v, want an error naming it", err)
	}
}
