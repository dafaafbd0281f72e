package recentload

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sockscale/sockscale/internal/stats"
)

var t0 = time.Unix(1_700_000_000, 0)

// at is t0 plus seconds, fractions allowed.
func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

// approx compares the averages to float32's precision (the buckets').
var approx = cmp.Options{cmpopts.EquateApprox(0, 1e-5), cmpopts.EquateComparable(netip.Addr{})}

func newStore(t testing.TB, window time.Duration) (*Store, *clocktesting.FakeClock) {
	t.Helper()
	clk := clocktesting.NewFakeClock(t0)
	s, err := New(clk, window)
	if err != nil {
		t.Fatal(err)
	}
	return s, clk
}

// podRecord builds an agent's record of a pod of ns/hello.
type podRecord stats.PodStat

func podNamed(name string) *podRecord {
	return &podRecord{IP: netip.MustParseAddr("10.0.0.1"), Namespace: "ns", Pod: name, Workload: "hello"}
}

// At sets its address.
func (p *podRecord) At(ip string) *podRecord { p.IP = netip.MustParseAddr(ip); return p }

// Of sets its workload.
func (p *podRecord) Of(workload string) *podRecord { p.Workload = workload; return p }

// Load sets its requests in flight and completed, proxied ones included.
func (p *podRecord) Load(concurrency float64, requests uint64) *podRecord {
	p.Concurrency, p.Requests = concurrency, requests
	return p
}

// Proxied sets the part of its load that came through activators.
func (p *podRecord) Proxied(concurrency float64, requests uint64) *podRecord {
	p.ProxiedConcurrency, p.ProxiedRequests = concurrency, requests
	return p
}

func (p *podRecord) Obj() stats.PodStat { return stats.PodStat(*p) }

// agent is node's batch of its last second.
func agent(node string, pods ...*podRecord) *stats.Batch {
	b := &stats.Batch{Node: node, Period: time.Second}
	for _, p := range pods {
		b.Pods = append(b.Pods, p.Obj())
	}
	return b
}

// activator is an activator's batch of its last period for ns/hello.
func activator(name string, period time.Duration, concurrency float64, requests uint64) *stats.Batch {
	return &stats.Batch{Node: name, Period: period,
		Targets: []stats.TargetStat{{Namespace: "ns", Workload: "hello", Concurrency: concurrency, Requests: requests}}}
}

// seconds steps clk one second at a time, n times, calling each after
// every step (as batches arrive, one a second).
func seconds(clk *clocktesting.FakeClock, n int, each func()) {
	for range n {
		clk.Step(time.Second)
		each()
	}
}

func TestNewWindowBounds(t *testing.T) {
	for _, tc := range []struct {
		window  time.Duration
		wantErr string
	}{
		{window: 5 * time.Second, wantErr: "recent load window 5s: want 6s to 10m0s"},
		{window: 6 * time.Second},
		{window: 10 * time.Minute},
		{window: 10*time.Minute + time.Second, wantErr: "recent load window 10m1s: want 6s to 10m0s"},
	} {
		t.Run(tc.window.String(), func(t *testing.T) {
			_, err := New(clocktesting.NewFakeClock(t0), tc.window)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.wantErr {
				t.Errorf("New(%v) error %q, want %q", tc.window, got, tc.wantErr)
			}
		})
	}
}

// A pod heard for 10 s of a 60 s window averages those 10 s.
func TestPodAveragesTheSecondsItWasHeard(t *testing.T) {
	s, clk := newStore(t, time.Minute)
	clk.Step(50 * time.Second)
	seconds(clk, 5, func() { s.RecordPods("node-a", agent("node-a", podNamed("hello-1").Load(4, 30))) })
	seconds(clk, 5, func() { s.RecordPods("node-a", agent("node-a", podNamed("hello-1").Load(2, 30))) })

	got, ok := s.Pod("ns", "hello-1")
	want := PodLoad{Namespace: "ns", Name: "hello-1", IP: netip.MustParseAddr("10.0.0.1"), Node: "node-a", Workload: "hello",
		Concurrency: 3, RPS: 30, Heard: at(60)}
	if diff := cmp.Diff(want, got, approx); !ok || diff != "" {
		t.Errorf("Pod: ok %v (-want +got):\n%s", ok, diff)
	}
	if _, ok := s.Pod("ns", "hello-2"); ok {
		t.Error("Pod of a pod never reported: ok, want not found")
	}
}

// The window slides over whole buckets: a read covers the 12 complete
// buckets (5 s each here) before the one it falls in, and that one.
func TestPodWindowSlides(t *testing.T) {
	s, clk := newStore(t, time.Minute)
	record := func(concurrency float64, requests uint64) func() {
		return func() { s.RecordPods("node-a", agent("node-a", podNamed("hello-1").Load(concurrency, requests))) }
	}
	seconds(clk, 30, record(10, 10)) // [0, 30)
	seconds(clk, 34, record(2, 20))  // [30, 64)
	check := func(when string, wantOK bool, wantConcurrency, wantRPS float64) {
		t.Helper()
		got, ok := s.Pod("ns", "hello-1")
		if ok != wantOK || !cmp.Equal(wantConcurrency, got.Concurrency, approx) || !cmp.Equal(wantRPS, got.RPS, approx) {
			t.Errorf("%s: Pod = %v, %v/s, %v; want %v, %v/s, %v", when, got.Concurrency, got.RPS, ok, wantConcurrency, wantRPS, wantOK)
		}
	}
	// At 64 s the read covers [0, 65): everything so far.
	check("at 64 s", true, (30*10+34*2)/64.0, (30*10+34*20)/64.0)
	seconds(clk, 26, record(2, 20)) // [64, 90)
	// At 90 s it covers [30, 95): the last 60 s, all at 2.
	check("at 90 s", true, 2, 20)
	// Quiet from 90 s: at 149 s the read covers [85, 150), 5 s of it
	// heard, so the pod still reads its average of those.
	clk.SetTime(at(149))
	check("at 149 s", true, 2, 20)
	// At 150 s it covers [90, 155): nothing heard.
	clk.SetTime(at(150))
	check("at 150 s", false, 0, 0)
}

// A report that arrives as the store starts covers the second before it.
func TestReportBeforeTheEpoch(t *testing.T) {
	s, _ := newStore(t, 6*time.Second)
	s.RecordPods("node-a", agent("node-a", podNamed("hello-1").Load(3, 7)))
	got, ok := s.Pod("ns", "hello-1")
	if !ok || !cmp.Equal(3.0, got.Concurrency, approx) || !cmp.Equal(7.0, got.RPS, approx) {
		t.Errorf("Pod = %v, %v/s, %v; want 3, 7/s, true", got.Concurrency, got.RPS, ok)
	}
}

// A period longer than the window counts only its last window.
func TestPeriodLongerThanTheWindow(t *testing.T) {
	s, clk := newStore(t, 6*time.Second)
	clk.Step(time.Minute)
	s.RecordPods("node-a", &stats.Batch{Node: "node-a", Period: time.Minute, Pods: []stats.PodStat{podNamed("hello-1").Load(5, 600).Obj()}})
	got, ok := s.Pod("ns", "hello-1")
	// 6 s heard, 6/60 of the 600 requests.
	if !ok || !cmp.Equal(5.0, got.Concurrency, approx) || !cmp.Equal(10.0, got.RPS, approx) {
		t.Errorf("Pod = %v, %v/s, %v; want 5, 10/s, true", got.Concurrency, got.RPS, ok)
	}
}

// The worked example of the Store's comment: two pods, each 5 in flight
// of which 1 through an activator, and an activator that held 2 requests
// for 15 s of the 60 s.
func TestTargetCountsEachRequestOnce(t *testing.T) {
	s, clk := newStore(t, time.Minute)
	pods := func() {
		s.RecordPods("node-a", agent("node-a", podNamed("hello-1").At("10.0.0.1").Load(5, 50).Proxied(1, 10), podNamed("hello-2").At("10.0.0.2").Load(5, 50).Proxied(1, 10)))
	}
	seconds(clk, 15, func() {
		pods()
		s.RecordTargets(activator("activator-1", time.Second, 2, 1))
	})
	seconds(clk, 45, pods)

	got, ok := s.Target("ns", "hello", nil)
	want := TargetLoad{
		Concurrency:          2*(5-1) + 2*15/60.0,
		RPS:                  2*(50-10) + 15/60.0,
		ActivatorConcurrency: 2 * 15 / 60.0,
		LatestConcurrency:    2 * (5 - 1), // the activator's latest report is 45 s old
		Pods:                 2,
		Heard:                at(60),
	}
	if diff := cmp.Diff(want, got, approx); !ok || diff != "" {
		t.Errorf("Target: ok %v (-want +got):\n%s", ok, diff)
	}
	// A pod reads its own load, proxied requests included.
	p, _ := s.Pod("ns", "hello-1")
	if !cmp.Equal(5.0, p.Concurrency, approx) || !cmp.Equal(50.0, p.RPS, approx) {
		t.Errorf("Pod = %v, %v/s; want 5, 50/s", p.Concurrency, p.RPS)
	}

	// An activator reporting now counts in LatestConcurrency.
	s.RecordTargets(activator("activator-2", time.Second, 3, 3))
	got, _ = s.Target("ns", "hello", nil)
	if !cmp.Equal(8.0+3, got.LatestConcurrency, approx) {
		t.Errorf("LatestConcurrency with an activator heard now = %v, want 11", got.LatestConcurrency)
	}
}

// Only the pods keep says to count are counted; what it is given names
// the pod and where its record came from.
func TestTargetKeep(t *testing.T) {
	s, clk := newStore(t, 6*time.Second)
	seconds(clk, 6, func() {
		s.RecordPods("node-a", agent("node-a", podNamed("hello-1").At("10.0.0.1").Load(4, 40)))
		s.RecordPods("node-b", agent("node-b", podNamed("hello-2").At("10.0.0.2").Load(1, 10)))
	})
	var seen []string
	got, ok := s.Target("ns", "hello", func(p PodLoad) bool {
		seen = append(seen, fmt.Sprintf("%s/%s at %s on %s of %s", p.Namespace, p.Name, p.IP, p.Node, p.Workload))
		return p.Node == "node-b"
	})
	if !ok || got.Pods != 1 || !cmp.Equal(1.0, got.Concurrency, approx) || !cmp.Equal(10.0, got.RPS, approx) {
		t.Errorf("Target keeping node-b's pod = %+v, %v; want 1 pod, 1 in flight, 10/s", got, ok)
	}
	want := []string{"ns/hello-1 at 10.0.0.1 on node-a of hello", "ns/hello-2 at 10.0.0.2 on node-b of hello"}
	if diff := cmp.Diff(want, seen, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("keep was given (-want +got):\n%s", diff)
	}
	if _, ok := s.Target("ns", "hello", func(PodLoad) bool { return false }); ok {
		t.Error("Target keeping no pod, and no activator: ok, want not heard")
	}
	if _, ok := s.Target("ns", "nobody", nil); ok {
		t.Error("Target never heard: ok, want not heard")
	}
}

// A target at zero pods has only its activators' load.
func TestTargetOfActivatorsOnly(t *testing.T) {
	s, clk := newStore(t, 6*time.Second)
	clk.Step(6 * time.Second)
	s.RecordTargets(activator("activator-1", time.Millisecond, 1, 0)) // a poke
	got, ok := s.Target("ns", "hello", nil)
	want := TargetLoad{Concurrency: 0.001 / 6, ActivatorConcurrency: 0.001 / 6, LatestConcurrency: 1, Heard: at(6)}
	if diff := cmp.Diff(want, got, approx); !ok || diff != "" {
		t.Errorf("Target after a poke: ok %v (-want +got):\n%s", ok, diff)
	}
}

// A pod's history is its node's, address's and workload's: a record that
// changes any of them starts it anew.
func TestRecordThatChangesAPodStartsAnew(t *testing.T) {
	s, clk := newStore(t, time.Minute)
	seconds(clk, 10, func() { s.RecordPods("node-a", agent("node-a", podNamed("hello-1").Load(4, 4))) })

	clk.Step(time.Second)
	s.RecordPods("node-b", agent("node-b", podNamed("hello-1").Load(100, 100)))
	got, _ := s.Pod("ns", "hello-1")
	if got.Node != "node-b" || !cmp.Equal(100.0, got.Concurrency, approx) {
		t.Errorf("after node-b's record: %s, %v in flight; want node-b, 100", got.Node, got.Concurrency)
	}

	clk.Step(time.Second)
	s.RecordPods("node-a", agent("node-a", podNamed("hello-1").Load(4, 4)))
	clk.Step(time.Second)
	s.RecordPods("node-a", agent("node-a", podNamed("hello-1").At("10.0.0.9").Load(6, 6)))
	got, _ = s.Pod("ns", "hello-1")
	if got.IP != netip.MustParseAddr("10.0.0.9") || !cmp.Equal(6.0, got.Concurrency, approx) {
		t.Errorf("after a new address: %s, %v in flight; want 10.0.0.9, 6", got.IP, got.Concurrency)
	}

	clk.Step(time.Second)
	s.RecordPods("node-a", agent("node-a", podNamed("hello-1").At("10.0.0.9").Of("other").Load(8, 8)))
	if l, ok := s.Target("ns", "hello", nil); ok {
		t.Errorf("hello after its pod moved to other: %+v, want not heard", l)
	}
	if l, ok := s.Target("ns", "other", nil); !ok || l.Pods != 1 || !cmp.Equal(8.0, l.Concurrency, approx) {
		t.Errorf("other after the pod moved to it: %+v, %v; want 1 pod, 8 in flight", l, ok)
	}
}

// An IPv6-only pod is known by its IPv6 address as an IPv4 one is by
// its: a record from another address, of either family, starts its
// history anew, the address read back is the last recorded, and a pruned
// pod leaves nothing of its address behind.
func TestIPv6Pods(t *testing.T) {
	s, clk := newStore(t, 6*time.Second)
	seconds(clk, 3, func() {
		s.RecordPods("node-a", agent("node-a", podNamed("v6-1").At("fd00::1").Load(4, 4), podNamed("v4-1").At("10.0.0.1").Load(2, 2)))
	})
	for _, tc := range []struct {
		name, ip string
		want     float64
	}{
		{"v6-1", "fd00::1", 4},
		{"v4-1", "10.0.0.1", 2},
	} {
		got, ok := s.Pod("ns", tc.name)
		if !ok || got.IP != netip.MustParseAddr(tc.ip) || !cmp.Equal(tc.want, got.Concurrency, approx) {
			t.Errorf("%s: %v, %+v; want %s with %v in flight", tc.name, ok, got, tc.ip, tc.want)
		}
	}
	for _, step := range []struct{ ip string }{{"fd00::2"}, {"10.0.0.7"}, {"fd00::3"}} {
		clk.Step(time.Second)
		s.RecordPods("node-a", agent("node-a", podNamed("v6-1").At(step.ip).Load(9, 9)))
		got, _ := s.Pod("ns", "v6-1")
		if got.IP != netip.MustParseAddr(step.ip) || !cmp.Equal(9.0, got.Concurrency, approx) {
			t.Errorf("after a record from %s: %s, %v in flight; want %s, 9 (a new history)", step.ip, got.IP, got.Concurrency, step.ip)
		}
	}
	if n := len(s.shard("v6-1").ipv6); n != 1 {
		t.Errorf("the shard holds %d IPv6 addresses, want the pod's one", n)
	}
	clk.Step(10 * time.Second)
	s.RecordPods("node-a", agent("node-a", podNamed("other").At("10.0.0.9").Load(1, 1)))
	if _, ok := s.Pod("ns", "v6-1"); ok {
		t.Error("v6-1 after the prune: found, want not")
	}
	for i := range s.shards {
		if n := len(s.shards[i].ipv6); n != 0 {
			t.Errorf("shard %d holds %d IPv6 addresses after the prune, want 0", i, n)
		}
	}
}

// With a verifier, another node's claim on a pod with a history is
// dropped instead of starting it anew, however often it comes; the pod's
// own node is asked about only when a record changes node or address,
// and wins back a pod a liar reported first.
func TestVerifierKeepsAPodsOwnHistory(t *testing.T) {
	s, clk := newStore(t, time.Minute)
	var asked []string
	s.SetVerifier(func(namespace, name, node string, ip netip.Addr) bool {
		asked = append(asked, fmt.Sprintf("%s/%s %s %s", namespace, name, node, ip))
		return node == "node-a" && ip == netip.MustParseAddr("10.0.0.1") // where the API server has it
	})
	// A liar speaks first, for a pod nobody reported yet: nothing to check against.
	s.RecordPods("node-x", agent("node-x", podNamed("hello-1").Load(99, 99)))
	seconds(clk, 10, func() {
		s.RecordPods("node-a", agent("node-a", podNamed("hello-1").Load(4, 4)))
		s.RecordPods("node-x", agent("node-x", podNamed("hello-1").Load(99, 99)))
	})
	got, _ := s.Pod("ns", "hello-1")
	if got.Node != "node-a" || !cmp.Equal(4.0, got.Concurrency, approx) || !cmp.Equal(4.0, got.RPS, approx) {
		t.Errorf("hello-1 with node-x claiming it every second: %+v; want node-a's 4 in flight, 4/s", got)
	}
	// Asked once for node-a (taking the pod back from the liar), then once
	// per liar's record; node-a's own records are not asked about again.
	if len(asked) != 11 || asked[0] != "ns/hello-1 node-a 10.0.0.1" || asked[1] != "ns/hello-1 node-x 10.0.0.1" {
		t.Errorf("verifier asked %d times: %q", len(asked), asked)
	}
}

// Pods and activators not heard for a window (and a bucket) are dropped
// by a later record, and targets left with neither; a target someone
// waits for stays.
func TestPrune(t *testing.T) {
	s, clk := newStore(t, 6*time.Second)
	clk.Step(time.Second)
	s.RecordPods("node-a", agent("node-a", podNamed("a-1").Of("a").Load(1, 1)))
	s.RecordTargets(&stats.Batch{Node: "activator-1", Period: time.Second, Targets: []stats.TargetStat{{Namespace: "ns", Workload: "b", Concurrency: 1}}})
	s.WhenActive("ns", "waited")
	if pods, targets := s.Len(); pods != 1 || targets != 3 {
		t.Fatalf("Len = %d pods, %d targets; want 1, 3", pods, targets)
	}
	// At 7.4 s, a and b were heard 6.4 s ago: not yet a window and a
	// bucket (6.5 s).
	clk.SetTime(at(7.4))
	s.RecordPods("node-a", agent("node-a", podNamed("c-1").Of("c").Load(1, 1)))
	if pods, targets := s.Len(); pods != 2 || targets != 4 {
		t.Errorf("at 7.4 s: Len = %d pods, %d targets; want 2, 4", pods, targets)
	}
	// The next prune is due a quarter window later (from 8.9 s).
	clk.SetTime(at(9))
	s.RecordPods("node-a", agent("node-a", podNamed("c-1").Of("c").Load(1, 1)))
	if pods, targets := s.Len(); pods != 1 || targets != 2 {
		t.Errorf("at 9 s: Len = %d pods, %d targets; want 1 (c-1), 2 (c, waited)", pods, targets)
	}
	if _, ok := s.Pod("ns", "a-1"); ok {
		t.Error("a-1 after the prune: found, want not")
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestWhenActive(t *testing.T) {
	idle := func(s *Store) { s.RecordPods("node-a", agent("node-a", podNamed("hello-1").Load(0, 0))) }
	busy := func(s *Store) { s.RecordPods("node-a", agent("node-a", podNamed("hello-1").Load(0.5, 0))) }
	t.Run("released by the record that makes it active", func(t *testing.T) {
		s, clk := newStore(t, 6*time.Second)
		first, second := s.WhenActive("ns", "hello"), s.WhenActive("ns", "hello")
		clk.Step(time.Second)
		idle(s)
		s.RecordPods("node-a", agent("node-a", podNamed("other-1").Of("other").Load(3, 3)))
		if isClosed(first) {
			t.Fatal("released by an idle record, or another target's")
		}
		clk.Step(time.Second)
		busy(s)
		if !isClosed(first) || !isClosed(second) {
			t.Errorf("after an active record: released %v, %v; want both", isClosed(first), isClosed(second))
		}
	})
	t.Run("released by an activator's poke", func(t *testing.T) {
		s, clk := newStore(t, 6*time.Second)
		wake := s.WhenActive("ns", "hello")
		clk.Step(time.Second)
		s.RecordTargets(activator("activator-1", time.Millisecond, 1, 0))
		if !isClosed(wake) {
			t.Error("not released by a poke")
		}
	})
	t.Run("at once when active now", func(t *testing.T) {
		s, clk := newStore(t, 6*time.Second)
		clk.Step(time.Second)
		busy(s)
		clk.Step(2 * time.Second) // the latest report is 2 s old: still now
		if !isClosed(s.WhenActive("ns", "hello")) {
			t.Error("not released at once")
		}
	})
	t.Run("not at once when the active report is old or followed by an idle one", func(t *testing.T) {
		s, clk := newStore(t, 6*time.Second)
		clk.Step(time.Second)
		busy(s)
		clk.Step(2*time.Second + time.Millisecond)
		if isClosed(s.WhenActive("ns", "hello")) {
			t.Error("released at once by a report over 2 s old")
		}
		clk.Step(time.Second)
		busy(s)
		clk.Step(time.Second)
		idle(s)
		wake := s.WhenActive("ns", "hello")
		if isClosed(wake) {
			t.Error("released at once after an idle report")
		}
		clk.Step(time.Second)
		busy(s)
		if !isClosed(wake) {
			t.Error("not released by the next active record")
		}
	})
}

// Agents, activators and readers at once, under -race: every pod
// recorded is read back.
func TestConcurrentUse(t *testing.T) {
	s, clk := newStore(t, time.Minute) // longer than the test's 16 s: nothing is pruned
	const agents, podsPerAgent, rounds = 8, 50, 20
	var wg sync.WaitGroup
	for a := range agents {
		node := fmt.Sprintf("node-%d", a)
		wg.Go(func() {
			for range rounds {
				b := &stats.Batch{Node: node, Period: time.Second}
				for i := range podsPerAgent {
					b.Pods = append(b.Pods, podNamed(fmt.Sprintf("%s-pod-%d", node, i)).At(fmt.Sprintf("10.0.%d.%d", a, i)).
						Of(fmt.Sprintf("w-%d", i%5)).Load(1, 1).Obj())
				}
				s.RecordPods(node, b)
				clk.Step(100 * time.Millisecond)
			}
		})
	}
	wg.Go(func() {
		for range rounds {
			s.RecordTargets(activator("activator-1", time.Second, 1, 1))
		}
	})
	for r := range 4 {
		wg.Go(func() {
			for i := range rounds * 10 {
				s.Pod("ns", fmt.Sprintf("node-%d-pod-%d", r, i%podsPerAgent))
				s.Target("ns", fmt.Sprintf("w-%d", i%5), func(PodLoad) bool { return true })
				s.WhenActive("ns", "hello")
			}
		})
	}
	wg.Wait()
	for a := range agents {
		for i := range podsPerAgent {
			if _, ok := s.Pod("ns", fmt.Sprintf("node-%d-pod-%d", a, i)); !ok {
				t.Fatalf("node-%d-pod-%d not found", a, i)
			}
		}
	}
	total := 0
	for w := range 5 {
		l, _ := s.Target("ns", fmt.Sprintf("w-%d", w), nil)
		total += l.Pods
	}
	if total != agents*podsPerAgent {
		t.Errorf("the targets count %d pods, want %d", total, agents*podsPerAgent)
	}
}
