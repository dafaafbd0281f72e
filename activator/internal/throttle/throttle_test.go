package throttle

import (
	"context"
	"errors"
	"fmt"
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
		c.err <- th.Try(ctx, key, func(d netip.AddrPort) error {
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

func TestShare(t *testing.T) {
	// slots[i][j]: activator i's slots at pod j.
	table := func(cc, p, n int) [][]int {
		s := make([][]int, n)
		for i := range s {
			s[i] = make([]int, p)
			for j := range p {
				s[i][j] = share(cc, p, n, i, j)
			}
		}
		return s
	}
	const u = unlimited
	tests := []struct {
		name     string
		cc, p, n int
		want     [][]int
	}{
		{"one activator takes everything", 3, 2, 1, [][]int{{3, 3}}},
		{"5 pods, 2 activators: whole pods, j mod n", 2, 5, 2, [][]int{{2, 0, 2, 0, 2}, {0, 2, 0, 2, 0}}},
		{"2 pods, 3 activators, cc 10: slots dealt 4/3/3 and 3/4/3", 10, 2, 3, [][]int{{4, 3}, {3, 4}, {3, 3}}},
		{"1 pod, 2 activators, cc 1: activator 1 waits for a second pod", 1, 1, 2, [][]int{{1}, {0}}},
		{"1 pod, 3 activators, cc 2", 2, 1, 3, [][]int{{1}, {1}, {0}}},
		{"unlimited, fewer pods than activators: all pods for all", 0, 1, 2, [][]int{{u}, {u}}},
		{"unlimited, whole pods", 0, 3, 2, [][]int{{u, 0, u}, {0, u, 0}}},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, table(tt.cc, tt.p, tt.n)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.name, diff)
		}
	}

	// The rule's promise, for every small case: the activators' slots at a
	// pod add up to exactly cc (never oversubscribed, nothing wasted), and
	// when there are at least as many slots as activators, each has one.
	for cc := 1; cc <= 12; cc++ {
		for p := 1; p <= 7; p++ {
			for n := 1; n <= 6; n++ {
				s := table(cc, p, n)
				for j := range p {
					sum := 0
					for i := range n {
						sum += s[i][j]
					}
					if sum != cc {
						t.Errorf("cc %d, %d pods, %d activators: pod %d has %d slots in all, want %d", cc, p, n, j, sum, cc)
					}
				}
				for i := range n {
					total := 0
					for j := range p {
						total += s[i][j]
					}
					if p*cc >= n && total == 0 {
						t.Errorf("cc %d, %d pods, %d activators: activator %d has no slot", cc, p, n, i)
					}
				}
			}
		}
	}
}

func TestAssignment(t *testing.T) {
	all := pods(4)
	tests := []struct {
		name       string
		self       string
		activators []string
		cc         int
		ready      []netip.AddrPort
		want       map[netip.AddrPort]int // slots of the pods this activator uses
	}{
		{"second of two activators takes pods 1 and 3 in sorted order", "act-b", []string{"act-b", "act-a"}, 5,
			[]netip.AddrPort{all[3], all[0], all[2], all[1]}, map[netip.AddrPort]int{all[1]: 5, all[3]: 5}},
		{"not in the path: every pod, full cc", "act-z", []string{"act-a", "act-b"}, 5, all[:2], map[netip.AddrPort]int{all[0]: 5, all[1]: 5}},
		{"no activator list: every pod", "act-a", nil, 1, all[:1], map[netip.AddrPort]int{all[0]: 1}},
		{"duplicate names count once", "act-b", []string{"act-a", "act-b", "act-b"}, 3, all[:2], map[netip.AddrPort]int{all[1]: 3}},
		{"1 pod, 3 activators, cc 10: a third of the slots", "act-c", []string{"act-a", "act-b", "act-c"}, 10, all[:1], map[netip.AddrPort]int{all[0]: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			th := newThrottler(t, Options{Self: tt.self}, Settings{ContainerConcurrency: tt.cc, Activators: tt.activators}, tt.ready...)
			q := th.queue(hello)
			got := map[netip.AddrPort]int{}
			for _, p := range q.assigned {
				got[p.addr] = p.slots
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("assigned slots (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFreeSlotGoesAtOnce(t *testing.T) {
	th := newThrottler(t, Options{}, Settings{ContainerConcurrency: 1}, pods(1)...)
	var got netip.AddrPort
	if err := th.Try(context.Background(), hello, func(d netip.AddrPort) error { got = d; return nil }); err != nil {
		t.Fatal(err)
	}
	if got != pods(1)[0] {
		t.Errorf("dest = %v, want %v", got, pods(1)[0])
	}
	fnErr := errors.New("pod said no")
	if err := th.Try(context.Background(), hello, func(netip.AddrPort) error { return fnErr }); !errors.Is(err, fnErr) {
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
	err := th.Try(context.Background(), hello, func(netip.AddrPort) error { t.Error("fn ran"); return nil })
	if !errors.Is(err, ErrQueueFull) || !strings.Contains(err.Error(), "default/hello already holds 2 requests, the queue depth") {
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
			go func() { errc <- th.Try(ctx, hello, func(netip.AddrPort) error { return nil }) }()
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
		_ = th.Try(context.Background(), hello, func(netip.AddrPort) error { panic("abort") })
	}()
	if err := th.Try(context.Background(), hello, func(netip.AddrPort) error { return nil }); err != nil {
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
				err := th.Try(ctx, hello, func(d netip.AddrPort) error {
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
