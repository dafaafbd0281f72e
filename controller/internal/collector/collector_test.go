package collector

import (
	"math"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/internal/stats"
)

var t0 = time.Unix(1_700_000_000, 0)

// at is t0 plus seconds, fractions allowed: at(10.5) is 10.5 s after t0.
func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

func settings(t testing.TB, spec *config.Overrides) config.Settings {
	t.Helper()
	s, err := config.Effective(config.Defaults(), 0, nil, spec)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var hello = Key{"ns", "hello"}

// ignoreAccounting leaves Values.Accounting out of comparisons of the
// windows' values (TestAccounting checks it).
var ignoreAccounting = cmpopts.IgnoreFields(Values{}, "Accounting")

// pod is one pod record of hello: (concurrency, proxied concurrency,
// requests, proxied requests).
type pod [4]float64

func podIP(node string, i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(len(node)), node[len(node)-1], byte(i)})
}

// batch is one agent's report of its last second: pods of hello. Start is
// the agent's own clock and is left at zero: the collector does not read
// it.
func batch(node string, pods ...pod) *stats.Batch {
	b := &stats.Batch{Node: node, Period: time.Second}
	for i, p := range pods {
		b.Pods = append(b.Pods, stats.PodStat{
			IP: podIP(node, i), Namespace: "ns", Pod: node + "-pod-" + strconv.Itoa(i), Workload: "hello",
			Concurrency: p[0], ProxiedConcurrency: p[1], Requests: uint64(p[2]), ProxiedRequests: uint64(p[3]),
		})
	}
	return b
}

// rig is a collector on a fake clock watching hello.
type rig struct {
	t   *testing.T
	clk *clocktesting.FakeClock
	c   *Collector
}

func newRig(t *testing.T, spec *config.Overrides) *rig {
	clk := clocktesting.NewFakeClock(t0)
	c := New(clk)
	if err := c.Watch(hello, hello, settings(t, spec)); err != nil {
		t.Fatal(err)
	}
	return &rig{t: t, clk: clk, c: c}
}

// arrive delivers b at sec (the collector's clock).
func (r *rig) arrive(sec float64, b *stats.Batch) []Key {
	r.clk.SetTime(at(sec))
	return r.c.RecordPods(b)
}

func (r *rig) values(sec float64) Values {
	r.t.Helper()
	v, err := r.c.Values(hello, at(sec))
	if err != nil {
		r.t.Fatal(err)
	}
	return v
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// TestWindowsAverageCompleteSecondsOnly is the timeline: one
// agent reports a true concurrency of 10 every second, arriving at
// mid-second. Read just after a second boundary, before that second's
// report came, the old windows counted the current second as 0: 9.83
// over 60 s, 8.33 over a 6 s panic window, 5.0 over a 2 s one. Only
// complete seconds count now, so every read is 10.
func TestWindowsAverageCompleteSecondsOnly(t *testing.T) {
	tests := []struct {
		name   string
		window time.Duration // the panic window is 10 % of it
		read   float64
	}{
		{"60 s / 6 s, just after a boundary", time.Minute, 100.2},
		{"60 s / 6 s, just after a report", time.Minute, 100.7},
		{"60 s / 6 s, at the boundary", time.Minute, 101},
		{"20 s / 2 s, just after a boundary", 20 * time.Second, 100.2},
		{"20 s / 2 s, just after a report", 20 * time.Second, 100.7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, &config.Overrides{Window: &tt.window})
			for k := 0.5; k <= tt.read; k++ {
				r.arrive(k, batch("node-a", pod{10, 0, 10, 0}))
			}
			got := r.values(tt.read)
			if diff := cmp.Diff(Values{Stable: 10, Panic: 10, HasData: true}, got, ignoreAccounting); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestReportsAreKeyedOnTheCollectorsClock: agents at different phases,
// with wall clocks far apart and arrival times that jitter around a
// second boundary, still add up to their sum in every second: off by no
// more than the jitter's share (2 ms either side of a second of node-b's
// 6: 0.024 in one second, less over a window), where
// keying by arrival second alone would put two reports of node-b into
// one second and none into the next.
func TestReportsAreKeyedOnTheCollectorsClock(t *testing.T) {
	r := newRig(t, nil)
	for k := 0; k < 120; k++ {
		a := batch("node-a", pod{4, 0, 4, 0})
		a.Start = t0.Add(-time.Hour) // a clock an hour behind
		// node-b's reports arrive 2 ms either side of the boundary.
		jitter := 0.002
		if k%2 == 1 {
			jitter = -0.002
		}
		b := batch("node-b", pod{6, 0, 6, 0})
		b.Start = t0.Add(time.Hour) // an hour ahead
		r.arrive(float64(k)+0.3, a)
		r.arrive(float64(k)+1+jitter, b)
		if k < 2 {
			continue
		}
		for _, read := range []float64{float64(k) + 0.5, float64(k) + 1.001} {
			if v := r.values(read); math.Abs(v.Stable-10) > 0.024 || math.Abs(v.Panic-10) > 0.024 {
				t.Fatalf("at %.3f: stable %v panic %v, want 4 + 6 = 10", read, v.Stable, v.Panic)
			}
		}
	}
}

// TestDeliveryJitterIsNotExtrapolated: five ready pods, 4 on node-a and
// 1 on node-b, each at 10 in flight; node-b's reports come late by up to
// 0.4 s and then on time again (an overloaded controller or network),
// each still saying "10 over the last second". A late report must cover
// the time after the one before it, not leave a gap that reads as an
// unheard pod: the gap's second would be extrapolated from the pods heard
// and the next report's squeezed second would count node-b again, 6 %
// too much with these delays (the scale bench saw 15 % at 1,000
// targets). Nor may it stretch over the delay: every second reads 50,
// off by no more than the timeline's creep toward the arrivals
// (lagCreep: 1 ms of node-b's 10).
func TestDeliveryJitterIsNotExtrapolated(t *testing.T) {
	r := newRig(t, nil)
	ready := map[netip.Addr]string{podIP("node-b", 0): "node-b"}
	for i := range 4 {
		ready[podIP("node-a", i)] = "node-a"
	}
	r.c.Expect(hello, ready)
	delays := []float64{0, 0.4, 0, 0.25, 0.1, 0, 0.3}
	for k := 1; k <= 130; k++ {
		r.arrive(float64(k), following(batch("node-a", pod{10, 0, 10, 0}, pod{10, 0, 10, 0}, pod{10, 0, 10, 0}, pod{10, 0, 10, 0}), k))
		r.arrive(float64(k)+0.5+delays[k%len(delays)], following(batch("node-b", pod{10, 0, 10, 0}), k))
		if k < 8 {
			continue
		}
		v := r.values(float64(k) + 0.2)
		if math.Abs(v.Stable-50) > 0.01 || math.Abs(v.Panic-50) > 0.01 {
			t.Fatalf("at %d.2: stable %.3f panic %.3f, want 50", k, v.Stable, v.Panic)
		}
	}
}

// following makes b the agent's k-th period, [k-1, k) on its own clock
// (an hour off the collector's), following on from its (k-1)-th.
func following(b *stats.Batch, k int) *stats.Batch {
	b.Start = at(float64(k - 1)).Add(time.Hour)
	return b
}

// TestAJitteryStartReadsTheLoad: one pod at 210 in flight (3.0 pods' worth
// at a target of 70), its agent's reports delivered 0 to 0.2 s after each
// period ends. From the first complete second on, every window reads 210:
// each report covers its own second, however late it came. Placed up to
// its arrival instead, a report 0.15 s late spread its second over 1.15 s
// and the next, prompt one crowded its second into 0.85 s: the windows of
// the first seconds read up to 217.9 here (3.11 pods' worth: 4 pods).
func TestAJitteryStartReadsTheLoad(t *testing.T) {
	r := newRig(t, nil)
	delays := []float64{0, 0.15, 0, 0.2, 0.05, 0, 0.18}
	for k := 1; k <= 40; k++ {
		r.arrive(float64(k)+delays[k%len(delays)], following(batch("node-a", pod{210, 0, 210, 0}), k))
		if k < 3 {
			continue
		}
		v := r.values(float64(k) + 0.25)
		if !v.HasData || math.Abs(v.Stable-210) > 0.5 || math.Abs(v.Panic-210) > 0.5 {
			t.Fatalf("at %d.25: stable %.3f panic %.3f (has data %v), want 210", k, v.Stable, v.Panic, v.HasData)
		}
	}
}

// TestASlowReporterClockIsCaughtUp: an agent whose clock runs slow
// reports periods of less than a second of its time that take a second of
// ours, so each report arrives later after the previous one than the
// period it covers. Its timeline creeps toward the arrivals (lagCreep a
// report): a clock 0.05 % slow stays within 2 ms of them; one 1 % slow,
// faster than the creep, is held to maxLag behind them. Either way the
// seconds it holds back keep completing and read the pod's 10 in flight
// (what the agent measured per second of its own clock).
func TestASlowReporterClockIsCaughtUp(t *testing.T) {
	for _, tt := range []struct {
		name   string
		period time.Duration // of the agent's clock, a second of ours
		maxLag time.Duration
		reads  float64
	}{
		{"0.05 % slow", 999500 * time.Microsecond, 2 * time.Millisecond, 9.995},
		{"1 % slow", 990 * time.Millisecond, maxLag, 9.9},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, nil)
			for k := 1; k <= 300; k++ {
				b := batch("node-a", pod{10, 0, 10, 0})
				b.Start, b.Period = t0.Add(time.Duration(k-1)*tt.period), tt.period
				r.arrive(float64(k)+0.5, b)
				src := r.c.targets[hello].pods[addrKeyOf4(podIP("node-a", 0))].src
				if lag := time.Duration(src.heard - src.until); lag > tt.maxLag {
					t.Fatalf("report %d: the timeline is %v behind the arrivals, want <= %v", k, lag, tt.maxLag)
				}
				if k < 200 {
					continue
				}
				if v := r.values(float64(k) + 0.6); !v.HasData || math.Abs(v.Stable-10) > 0.002 {
					t.Fatalf("at %d.6: stable %.4f (has data %v), want 10", k, v.Stable, v.HasData)
				}
			}
		})
	}
}

// TestALateSourceHoldsTheWindowBack: a live source's unreported time is
// waited for; once it is silent for StaleAfter the window moves on.
func TestALateSourceHoldsTheWindowBack(t *testing.T) {
	r := newRig(t, &config.Overrides{Window: ptr.To(6 * time.Second)})
	for k := 1.0; k <= 20; k++ {
		r.arrive(k, batch("node-a", pod{5, 0, 5, 0}))
		r.arrive(k+0.5, batch("node-b", pod{5, 0, 5, 0}))
	}
	// node-a's report due at 21 is late: at 21.4 the seconds after 20 wait.
	r.arrive(21.5, batch("node-b", pod{5, 0, 5, 0}))
	if v := r.values(21.9); !near(v.Stable, 10) {
		t.Errorf("while node-a is late: %v, want 10 (its unreported time is not a zero)", v.Stable)
	}
	// Silent since 20 for more than StaleAfter: no longer waited for, so
	// the window moves on to second 21, where it has no share (seconds
	// 16..19 hold 10, 20 and 21 node-b's 5).
	r.arrive(22.5, batch("node-b", pod{5, 0, 5, 0}))
	if v := r.values(22.6); !near(v.Stable, (4*10+5+5)/6.0) {
		t.Errorf("node-a silent 2.6 s: %v, want %v", v.Stable, (4*10+5+5)/6.0)
	}
}

func TestPodsOfOneTargetAddUpAcrossAgents(t *testing.T) {
	r := newRig(t, nil)
	for s := 1.0; s <= 6; s++ {
		r.arrive(s, batch("node-a", pod{3, 0, 30, 0}, pod{2, 0, 20, 0}))
		r.arrive(s, batch("node-b", pod{5, 0, 50, 0}))
	}
	// 3 + 2 + 5 = 10 in every second that exists.
	if diff := cmp.Diff(Values{Stable: 10, Panic: 10, HasData: true}, r.values(6), ignoreAccounting); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestProxiedRequestsAreNotCountedTwice(t *testing.T) {
	r := newRig(t, nil)
	// The pod has 4 in flight, 3 of them from an activator; the activator
	// reports its 3 itself: 1 + 3 = 4, not 7.
	r.arrive(1, batch("node-a", pod{4, 3, 40, 30}))
	r.c.RecordTargets(&stats.Batch{Node: "activator-0", Period: time.Second,
		Targets: []stats.TargetStat{{Namespace: hello.Namespace, Workload: hello.Name, Concurrency: 3, Requests: 30}}})
	if v := r.values(1); !near(v.Stable, 4) {
		t.Errorf("stable %v, want 4", v.Stable)
	}
	_ = r.c.Watch(hello, hello, settings(t, &config.Overrides{Metric: ptr.To(config.MetricRPS)}))
	if v := r.values(1); !near(v.Stable, 40) {
		t.Errorf("rps %v, want 10 direct + 30 through the activator = 40", v.Stable)
	}
}

// TestRecordTargetsReportsHeldLoad: an activator's batch names the watched
// targets with requests held, for the caller to poke; idle and unwatched
// targets are not named.
func TestRecordTargetsReportsHeldLoad(t *testing.T) {
	r := newRig(t, nil)
	idle := Key{Namespace: hello.Namespace, Name: "idle"}
	_ = r.c.Watch(idle, idle, settings(t, nil))
	got := r.c.RecordTargets(&stats.Batch{Node: "activator-0", Period: time.Second, Targets: []stats.TargetStat{
		{Namespace: hello.Namespace, Workload: hello.Name, Concurrency: 1},
		{Namespace: idle.Namespace, Workload: idle.Name, Concurrency: 0, Requests: 2},
		{Namespace: "elsewhere", Workload: "unwatched", Concurrency: 5},
	}})
	if diff := cmp.Diff([]Key{hello}, got); diff != "" {
		t.Errorf("active targets (-want +got):\n%s", diff)
	}
}

// TestAPokeCountsAtOnce: a target at zero, the activator's poke (3 held,
// a 1 ms period) arrives mid-second and the decider reads at once: the
// poke's second counts although it is not over.
func TestAPokeCountsAtOnce(t *testing.T) {
	r := newRig(t, &config.Overrides{Window: ptr.To(10 * time.Second)})
	// Idle for a while: the last pod's agent reported zeros until 20.
	for k := 11.0; k <= 20; k++ {
		r.arrive(k, batch("node-a", pod{0, 0, 0, 0}))
	}
	r.clk.SetTime(at(40.3))
	r.c.RecordTargets(&stats.Batch{Node: "activator-0", Period: time.Millisecond,
		Targets: []stats.TargetStat{{Namespace: hello.Namespace, Workload: hello.Name, Concurrency: 3}}})
	// 3 in the poke's second over the 10 s window, 1 s of panic window.
	if diff := cmp.Diff(Values{Stable: 0.3, Panic: 3, HasData: true}, r.values(40.3)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestMissingDataIsNotZeroLoad: an agent stops reporting at 30 s (crash
// loop, OOM, network) while its node's pods keep serving. Its pods are
// expected (ready), so their silence is not idleness: with enough pods
// heard their load is extrapolated from the others', with too few the
// windows hold the last seconds that had enough.
func TestMissingDataIsNotZeroLoad(t *testing.T) {
	type read struct {
		at   float64
		want Values
	}
	tests := []struct {
		name string
		// pods per node, each with 10 in flight; node-b's agent dies at 30.
		a, b   int
		expect bool
		reads  []read
	}{
		{"5 ready pods, 1 missing: 4 heard are Knative's sample size, so 40 + 40/4", 4, 1, true, []read{
			{29.5, Values{Stable: 50, Panic: 50, HasData: true, Expected: 5}},
			{40, Values{Stable: 50, Panic: 50, HasData: true, Expected: 5, Missing: 1, MissingNodes: []string{"node-b"}, Extrapolating: true}},
			{200, Values{Stable: 50, Panic: 50, HasData: true, Expected: 5, Missing: 1, MissingNodes: []string{"node-b"}, Extrapolating: true}},
		}},
		{"2 ready pods, 1 missing: too few heard, the windows hold", 1, 1, true, []read{
			{40, Values{Stable: 20, Panic: 20, HasData: true, Expected: 2, Missing: 1, MissingNodes: []string{"node-b"}}},
			// A whole stable window without enough pods heard: no data,
			// so the decider makes no decision.
			{100, Values{Expected: 2, Missing: 1, MissingNodes: []string{"node-b"}}},
		}},
		// Without knowing the ready pods, silence reads as idle (what the
		// collector did before it was told them).
		{"nobody said which pods are ready: node-b reads as idle", 1, 1, false, []read{
			// Seconds 1..28 hold 20, 29 holds 10 + half of node-b's 10,
			// 30..39 hold 10.
			{40, Values{Stable: (28*20 + 15 + 10*10) / 39.0, Panic: 10, HasData: true}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, nil)
			load := func(n int) []pod {
				ps := make([]pod, n)
				for i := range ps {
					ps[i] = pod{10, 0, 10, 0}
				}
				return ps
			}
			if tt.expect {
				ready := make(map[netip.Addr]string)
				for i := range tt.a {
					ready[podIP("node-a", i)] = "node-a"
				}
				for i := range tt.b {
					ready[podIP("node-b", i)] = "node-b"
				}
				r.c.Expect(hello, ready)
			}
			reads := tt.reads
			for k := 1.0; len(reads) > 0; k++ {
				for len(reads) > 0 && reads[0].at < k {
					if diff := cmp.Diff(reads[0].want, r.values(reads[0].at), ignoreAccounting); diff != "" {
						t.Errorf("at %v s (-want +got):\n%s", reads[0].at, diff)
					}
					reads = reads[1:]
				}
				r.arrive(k, batch("node-a", load(tt.a)...))
				if k < 30 {
					r.arrive(k+0.5, batch("node-b", load(tt.b)...))
				}
			}
		})
	}
}

// TestReadyPodsComeAndGo: pods joining and leaving the ready set are
// neither missed nor extrapolated: 3 ready pods of 10 each; at 20.5 s
// pod 2 stops being ready (it drains and is reported at 0 until it goes
// at 25 s), at 40.5 s a new pod 3 becomes ready.
func TestReadyPodsComeAndGo(t *testing.T) {
	r := newRig(t, &config.Overrides{Window: ptr.To(6 * time.Second)})
	ready := func(ips ...int) map[netip.Addr]string {
		m := make(map[netip.Addr]string)
		for _, i := range ips {
			m[podIP("node-a", i)] = "node-a"
		}
		return m
	}
	r.c.Expect(hello, ready(0, 1, 2))
	for k := 1.0; k <= 60; k++ {
		switch k {
		case 21:
			r.clk.SetTime(at(20.5))
			r.c.Expect(hello, ready(0, 1))
		case 41:
			r.clk.SetTime(at(40.5))
			r.c.Expect(hello, ready(0, 1, 3))
		}
		b := batch("node-a", pod{10, 0, 10, 0}, pod{10, 0, 10, 0}, pod{10, 0, 10, 0}, pod{10, 0, 10, 0})
		switch {
		case k <= 20:
			b.Pods = b.Pods[:3]
		case k <= 25:
			b.Pods[2].Concurrency = 0
			b.Pods = b.Pods[:3]
		case k <= 40:
			b.Pods = b.Pods[:2]
		default:
			b.Pods = append(b.Pods[:2], b.Pods[3])
		}
		r.arrive(k, b)
		want := map[bool]float64{true: 30, false: 20}[k <= 20 || k > 40]
		if v := r.values(k); !near(v.Panic, want) || v.Missing != 0 {
			t.Fatalf("at %v s: panic %v missing %d, want %v and 0", k, v.Panic, v.Missing, want)
		}
	}
}

// TestTheLastPodGoes: scaled to zero, the last pod leaves the ready set
// and stops reporting in the same second in which the activator starts
// holding requests: that second counts the activator's load, and is no
// hole left by the pod that is gone.
func TestTheLastPodGoes(t *testing.T) {
	r := newRig(t, &config.Overrides{Window: ptr.To(10 * time.Second)})
	r.c.Expect(hello, map[netip.Addr]string{podIP("node-a", 0): "node-a"})
	for k := 1.0; k <= 30; k++ {
		r.arrive(k, batch("node-a", pod{0, 0, 0, 0}))
	}
	r.clk.SetTime(at(30.2))
	r.c.Expect(hello, nil)
	for k := 31.0; k <= 32; k++ {
		r.clk.SetTime(at(k))
		r.c.RecordActivator(hello, "activator-0", time.Time{}, time.Second, 3, 3)
	}
	// Seconds 30 and 31 hold the activator's 3; the panic window is 1 s.
	if diff := cmp.Diff(Values{Stable: 0.6, Panic: 3, HasData: true}, r.values(32), ignoreAccounting); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestANewPodIsNotMissingAtOnce: a pod that just became ready may not be
// known to its node's agent yet; it counts as missing only after
// StaleAfter without stats.
func TestANewPodIsNotMissingAtOnce(t *testing.T) {
	r := newRig(t, nil)
	r.clk.SetTime(at(10.5))
	r.c.Expect(hello, map[netip.Addr]string{podIP("node-a", 0): "node-a"})
	for _, tt := range []struct {
		at      float64
		missing int
	}{{11.5, 0}, {12.9, 0}, {13.1, 1}} {
		if got := r.values(tt.at).Missing; got != tt.missing {
			t.Errorf("at %v s: %d missing, want %d", tt.at, got, tt.missing)
		}
	}
}

func TestSampleSize(t *testing.T) {
	got := map[int]float64{}
	for _, n := range []int{1, 2, 3, 4, 5, 10, 100, 1000} {
		got[n] = sampleSize(n)
	}
	want := map[int]float64{1: 1, 2: 2, 3: 3, 4: 4, 5: 4, 10: 7, 100: 14, 1000: 16}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestNoDataAndAgeing(t *testing.T) {
	r := newRig(t, nil)
	if v := r.values(0); v.HasData {
		t.Error("a target nobody reported on has data")
	}
	r.arrive(1, batch("node-a", pod{6, 0, 6, 0}))
	// The agent disappears: a minute later its pod's load has aged out.
	if v := r.values(62); !v.HasData || v.Stable != 0 || v.Panic != 0 {
		t.Errorf("a minute after the last report: %+v, want data with 0 load", v)
	}
	if _, err := r.c.Values(Key{"ns", "other"}, t0); err == nil || !strings.Contains(err.Error(), "ns/other: not watched") {
		t.Errorf("unwatched target: err = %v", err)
	}
}

func TestActiveTargetsForPoke(t *testing.T) {
	r := newRig(t, nil)
	if got := r.arrive(1, batch("node-a", pod{0, 0, 0, 0})); len(got) != 0 {
		t.Errorf("idle batch marked %v active", got)
	}
	got := r.arrive(2, batch("node-a", pod{1, 0, 1, 0}, pod{2, 0, 2, 0}))
	if len(got) != 1 || got[0] != hello {
		t.Errorf("active = %v, want [ns/hello] once", got)
	}
	other := batch("node-a", pod{5, 0, 5, 0})
	other.Pods[0].Workload = "unwatched"
	if got := r.arrive(3, other); len(got) != 0 {
		t.Errorf("unwatched target reported active: %v", got)
	}
}

func TestConcurrentUse(t *testing.T) {
	r := newRig(t, nil)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for s := range 100 {
				r.c.RecordPods(batch("node-"+string(rune('a'+g)), pod{1, 0, 1, 0}))
				_, _ = r.c.Values(hello, at(float64(s)))
			}
		})
	}
	wg.Wait()
	if _, err := r.c.Values(hello, t0); err != nil {
		t.Error(err)
	}
}

// BenchmarkIngest5000Agents is one second of stats from 5,000 nodes with
// 100 pods each, spread over 10,000 targets.
func BenchmarkIngest5000Agents(b *testing.B) {
	c, clk, batches := benchCollector(b)
	for b.Loop() {
		clk.Step(time.Second)
		for _, bt := range batches {
			c.RecordPods(bt)
		}
	}
}

// BenchmarkIngest5000AgentsPlaced is BenchmarkIngest5000Agents as the
// stats endpoint takes authenticated agents' batches: each batch's
// records placed by their targets' members (PodNodes), then recorded.
// Checking inside the recording pass instead, one lookup per record, was
// measured slower (480-577 ms a round against 429-460 ms): the separate
// placement pass takes the cache misses in a tight loop, and the
// recording pass then finds the entries warm.
func BenchmarkIngest5000AgentsPlaced(b *testing.B) {
	c, clk, batches := benchCollector(b)
	members := map[Key]map[netip.Addr]string{}
	for _, bt := range batches {
		for _, p := range bt.Pods {
			k := Key{p.Namespace, p.Workload}
			if members[k] == nil {
				members[k] = map[netip.Addr]string{}
			}
			members[k][p.IP] = bt.Node
		}
	}
	for k, m := range members {
		c.Members(k, m)
	}
	for b.Loop() {
		clk.Step(time.Second)
		for _, bt := range batches {
			for i, pl := range c.PodNodes(bt.Pods) {
				if pl.Node != bt.Node {
					b.Fatalf("record %d placed on %q", i, pl.Node)
				}
			}
			c.RecordPods(bt)
		}
	}
}

// benchCollector watches 10,000 targets and returns 5,000 agents'
// batches of 100 pods over them (as BenchmarkIngest5000Agents).
func benchCollector(b *testing.B) (*Collector, *clocktesting.FakeClock, []*stats.Batch) {
	b.Helper()
	clk := clocktesting.NewFakeClock(t0)
	c := New(clk)
	s, _ := config.Effective(config.Defaults(), 0, nil, nil)
	batches := make([]*stats.Batch, 5000)
	for n := range batches {
		bt := &stats.Batch{Node: "n", Period: time.Second}
		for p := range 100 {
			w := "t" + strconv.Itoa((n*100+p)%10000)
			bt.Pods = append(bt.Pods, stats.PodStat{IP: netip.AddrFrom4([4]byte{10, byte(n >> 8), byte(n), byte(p)}), Namespace: "ns", Workload: w, Concurrency: 1, Requests: 10})
		}
		batches[n] = bt
	}
	for i := range 10000 {
		_ = c.Watch(Key{"ns", "t" + strconv.Itoa(i)}, Key{"ns", "pa" + strconv.Itoa(i)}, s)
	}
	return c, clk, batches
}

// BenchmarkIngestParallel is agents' batches (one per op) taken by
// GOMAXPROCS stats handlers at once, as the stats server does.
func BenchmarkIngestParallel(b *testing.B) {
	c, _, batches := benchCollector(b)
	var next atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c.RecordPods(batches[next.Add(1)%int64(len(batches))])
		}
	})
}

// BenchmarkValuesWhileIngesting is reconcilers reading targets' values
// (one per op, on GOMAXPROCS workers) while one goroutine ingests
// batches without pause: what a decision waits for the collector.
func BenchmarkValuesWhileIngesting(b *testing.B) {
	c, clk, batches := benchCollector(b)
	for _, bt := range batches { // every target has data
		c.RecordPods(bt)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for n := 0; ; n++ {
			select {
			case <-done:
				return
			default:
			}
			c.RecordPods(batches[n%len(batches)])
		}
	})
	now := clk.Now()
	var next atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, _ = c.Values(Key{"ns", "t" + strconv.Itoa(int(next.Add(1)%10000))}, now)
		}
	})
	b.StopTimer()
	close(done)
	wg.Wait()
}

// TestPodNodes: each record of a watched target is placed by the
// target's members (Members), so the stats handler can drop the records
// of pods another node runs or no target has.
func TestPodNodes(t *testing.T) {
	c := New(clocktesting.NewFakeClock(time.Unix(1700000000, 0)))
	hello := Key{"default", "hello"}
	if err := c.Watch(hello, hello, settings(t, nil)); err != nil {
		t.Fatal(err)
	}
	c.Members(hello, map[netip.Addr]string{netip.MustParseAddr("10.1.0.1"): "node-a", netip.MustParseAddr("10.1.0.2"): "node-b"})
	c.Members(Key{"default", "unwatched"}, map[netip.Addr]string{netip.MustParseAddr("10.1.0.3"): "node-a"})
	rec := func(ip, workload string) stats.PodStat {
		return stats.PodStat{IP: netip.MustParseAddr(ip), Namespace: "default", Pod: "p", Workload: workload}
	}
	got := c.PodNodes([]stats.PodStat{rec("10.1.0.1", "hello"), rec("10.1.0.2", "hello"), rec("10.1.0.9", "hello"), rec("10.1.0.3", "unwatched"),
		rec("10.1.0.2", "other")})
	want := []PodNode{{true, "node-a"}, {true, "node-b"}, {true, ""}, {false, ""}, {false, ""}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestPodEntriesLiveWhileTheyMatter: a pod's one entry (reports,
// expectation, membership) outlives any one of them while another still
// holds, and goes when none does, so the targets' maps do not grow with
// every pod that ever ran.
func TestPodEntriesLiveWhileTheyMatter(t *testing.T) {
	r := newRig(t, nil)
	a, b, gone := podIP("node-a", 0), podIP("node-b", 0), podIP("node-a", 1)
	r.c.Members(hello, map[netip.Addr]string{a: "node-a", b: "node-b"})
	r.c.Expect(hello, map[netip.Addr]string{a: "node-a"})
	r.arrive(1, batch("node-a", pod{1, 0, 1, 0}, pod{2, 0, 2, 0})) // a, and gone (no member)
	r.values(1000)                                                 // long after every report: pruned
	place := func() []PodNode {
		return r.c.PodNodes([]stats.PodStat{{IP: a, Namespace: "ns", Workload: "hello"}, {IP: b, Namespace: "ns", Workload: "hello"}})
	}
	if diff := cmp.Diff([]PodNode{{true, "node-a"}, {true, "node-b"}}, place()); diff != "" {
		t.Errorf("members after their reports aged out (-want +got):\n%s", diff)
	}
	if v := r.values(1000); v.Expected != 1 || v.Missing != 1 {
		t.Errorf("a, ready but silent: expected %d missing %d, want 1 and 1", v.Expected, v.Missing)
	}
	tg := r.c.target(hello)
	if _, ok := tg.pods[addrKeyOf4(gone)]; ok {
		t.Error("a pod that is no member, not expected and silent for the window still has an entry")
	}
	// a stops being ready and b a member: both go once the window has
	// passed a's last expected second.
	r.clk.SetTime(at(1001))
	r.c.Expect(hello, nil)
	r.c.Members(hello, nil)
	r.values(2000)
	if n := len(tg.pods); n != 0 {
		t.Errorf("%d entries left after every pod left, want 0", n)
	}
	if diff := cmp.Diff([]PodNode{{true, ""}, {true, ""}}, place()); diff != "" {
		t.Errorf("pods that left (-want +got):\n%s", diff)
	}
}

// TestIPv6Pods: an IPv6-only pod's records count, are expected and are
// placed by its IPv6 address as an IPv4 pod's are by its own, beside an
// IPv4 pod of the same target; a record whose address is one member's
// (IPv4) in IPv4-mapped form is that member's.
func TestIPv6Pods(t *testing.T) {
	r := newRig(t, nil)
	v4, v6 := podIP("node-a", 0), netip.MustParseAddr("fd00::a:1")
	r.c.Members(hello, map[netip.Addr]string{v4: "node-a", v6: "node-b"})
	r.c.Expect(hello, map[netip.Addr]string{v4: "node-a", v6: "node-b"})
	for sec := 2; sec <= 80; sec++ {
		a := batch("node-a", pod{10, 0, 10, 0})
		b := batch("node-b", pod{20, 0, 20, 0})
		b.Pods[0].IP = v6
		r.arrive(float64(sec)+0.5, a)
		r.arrive(float64(sec)+0.5, b)
	}
	if v := r.values(80.6); v.Stable != 30 || v.Expected != 2 || v.Missing != 0 {
		t.Errorf("an IPv4 pod at 10 and an IPv6 pod at 20: %+v, want stable 30, 2 expected, none missing", v)
	}
	got := r.c.PodNodes([]stats.PodStat{{IP: v6, Namespace: "ns", Workload: "hello"}, {IP: netip.MustParseAddr("fd00::a:2"), Namespace: "ns", Workload: "hello"},
		{IP: netip.AddrFrom16(v4.As16()), Namespace: "ns", Workload: "hello"}})
	if diff := cmp.Diff([]PodNode{{true, "node-b"}, {true, ""}, {true, "node-a"}}, got); diff != "" {
		t.Errorf("placing IPv6 records (-want +got):\n%s", diff)
	}
	r.c.Expect(hello, map[netip.Addr]string{v4: "node-a"})
	if v := r.values(83); v.Expected != 1 {
		t.Errorf("after the IPv6 pod stopped being ready: %d expected, want 1", v.Expected)
	}
}

func addrKeyOf4(a netip.Addr) addrKey { ip, _ := addrKeyOf(a); return ip }

// TestTwoPodAutoscalersShareATarget: the windows of a Deployment that two
// PodAutoscalers watch outlive the first one's Forget (its data still
// counts for the other) and go with the second's.
func TestTwoPodAutoscalersShareATarget(t *testing.T) {
	r := newRig(t, nil) // hello watched by PodAutoscaler hello
	other := Key{"ns", "other-pa"}
	if err := r.c.Watch(hello, other, settings(t, nil)); err != nil {
		t.Fatal(err)
	}
	for s := 1; s <= 10; s++ {
		r.arrive(float64(s), batch("node-a", pod{4, 0, 4, 0}))
	}
	r.c.Forget(hello, hello)
	if v, err := r.c.Values(hello, at(10)); err != nil || !v.HasData {
		t.Fatalf("after one of two watchers forgot it: %+v, %v; want the windows kept", v, err)
	}
	r.c.Forget(hello, hello) // twice: still one watcher left
	if r.c.Len() != 1 {
		t.Fatalf("a repeated Forget dropped the target")
	}
	r.c.Forget(hello, other)
	if _, err := r.c.Values(hello, at(10)); err == nil || r.c.Len() != 0 {
		t.Errorf("after both forgot it: err %v, %d targets; want it gone", err, r.c.Len())
	}
	// Watched again, it starts empty.
	if err := r.c.Watch(hello, other, settings(t, nil)); err != nil {
		t.Fatal(err)
	}
	if v, _ := r.c.Values(hello, at(10)); v.HasData {
		t.Errorf("a target watched anew kept the old windows: %+v", v)
	}
}

// TestRestartForgetsTheGap: a replica kept a target's windows while it
// held its bucket (load 10), then got no reports for 30 s while another
// replica held it. Read as they are, the windows would average 30 s of
// 10 over 60 s, about 5: half the load. Restarted when the bucket comes back,
// they have no data until the next report, and then average only the
// seconds reported since: 20, the load of now.
func TestRestartForgetsTheGap(t *testing.T) {
	r := newRig(t, nil)
	for k := 0.5; k < 30; k++ {
		r.arrive(k, batch("node-a", pod{10, 0, 10, 0}))
	}
	if got := r.values(60).Stable; got < 4.5 || got > 5.5 {
		t.Fatalf("without a restart the gap reads as zeros: stable %v, want about 5 (the case Restart is for)", got)
	}
	r.c.Restart(hello)
	if got := r.values(60.2); got.HasData {
		t.Errorf("right after Restart: %+v, want no data", got)
	}
	for k := 60.5; k < 64; k++ {
		r.arrive(k, batch("node-a", pod{20, 0, 20, 0}))
	}
	if diff := cmp.Diff(Values{Stable: 20, Panic: 20, HasData: true}, r.values(64), ignoreAccounting); diff != "" {
		t.Errorf("after Restart and 3 s of reports (-want +got):\n%s", diff)
	}
	r.c.Restart(Key{"ns", "unwatched"}) // nothing to restart: no effect
}

// TestAccounting: the pods' concurrency and its part on connections
// counted per connection, averaged over the stable window like the
// target's value, and the pods that were counted per connection in it.
func TestAccounting(t *testing.T) {
	window := 10 * time.Second
	r := newRig(t, &config.Overrides{Window: &window})
	if got := r.values(0.2).Accounting; got != (Accounting{}) {
		t.Errorf("before any report: %+v, want no data", got)
	}
	// node-a: a TLS pod, 2 connections in flight, all opaque; node-b: an
	// h2c pod at 6 in flight, 2 of them through an activator. For 10 s.
	tls := func(b *stats.Batch) *stats.Batch {
		b.Pods[0].Accounting, b.Pods[0].OpaqueConcurrency = stats.AccountingConnections, b.Pods[0].Concurrency
		return b
	}
	h2c := func(b *stats.Batch) *stats.Batch {
		b.Pods[0].Accounting = stats.AccountingHTTP2Streams
		return b
	}
	for k := 0.5; k < 10; k++ {
		r.arrive(k, tls(batch("node-a", pod{2, 0, 0, 0})))
		r.arrive(k, h2c(batch("node-b", pod{6, 2, 60, 20})))
	}
	// Proxied requests are the activators' in the value, not in the
	// pods' concurrency: 2 + 6 = 8, of which 2 opaque.
	want := Accounting{HasData: true, Concurrency: 8, Opaque: 2, ConnectionPods: 1}
	if diff := cmp.Diff(want, r.values(10).Accounting, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("both pods for 10 s (-want +got):\n%s", diff)
	}
	// The TLS pod's connections close; it reports HTTP/1 from 10 s on.
	// Read at 15 s, the complete seconds are 4 to 13, of which the TLS
	// pod's reports until 9.5 s covered 5.5: 2 x 5.5 / 10 = 1.1 opaque,
	// and 6 + 1.1 in flight.
	for k := 10.5; k < 15; k++ {
		r.arrive(k, batch("node-a", pod{0, 0, 0, 0}))
		r.arrive(k, h2c(batch("node-b", pod{6, 2, 60, 20})))
	}
	want = Accounting{HasData: true, Concurrency: 7.1, Opaque: 1.1, ConnectionPods: 1}
	if diff := cmp.Diff(want, r.values(15).Accounting, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("the TLS pod's connections closed at 10 s, read at 15 s (-want +got):\n%s", diff)
	}
	// A window later, nothing of it is left.
	for k := 15.5; k < 21; k++ {
		r.arrive(k, batch("node-a", pod{0, 0, 0, 0}))
		r.arrive(k, h2c(batch("node-b", pod{6, 2, 60, 20})))
	}
	want = Accounting{HasData: true, Concurrency: 6}
	if diff := cmp.Diff(want, r.values(21).Accounting, cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("a window after the TLS connections (-want +got):\n%s", diff)
	}
	// No pod reports for a window: no data, whatever the ring holds.
	if got := r.values(32).Accounting; got.HasData {
		t.Errorf("a window without pod reports: %+v, want no data", got)
	}
}
