package collector

import (
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/internal/stats"
)

var t0 = time.Unix(1_700_000_000, 0)

func settings(t *testing.T, spec *config.Overrides) config.Settings {
	t.Helper()
	s, err := config.Effective(config.Defaults(), 0, nil, spec)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var hello = Key{"ns", "hello"}

// batch is one agent's report of one second: pods of hello with these
// (concurrency, proxied concurrency, requests, proxied requests).
func batch(node string, sec int, pods ...[4]float64) *stats.Batch {
	b := &stats.Batch{Node: node, Start: t0.Add(time.Duration(sec) * time.Second), Period: time.Second}
	for i, p := range pods {
		b.Pods = append(b.Pods, stats.PodStat{
			IP: netip.AddrFrom4([4]byte{10, 0, byte(len(node)), byte(i)}), Namespace: "ns", Pod: "hello-x", Workload: "hello",
			Concurrency: p[0], ProxiedConcurrency: p[1], Requests: uint64(p[2]), ProxiedRequests: uint64(p[3]),
		})
	}
	return b
}

func TestPodsOfOneTargetAddUpAcrossAgents(t *testing.T) {
	c := New()
	if err := c.Watch(hello, settings(t, nil)); err != nil {
		t.Fatal(err)
	}
	for s := range 6 {
		c.RecordPods(batch("node-a", s, [4]float64{3, 0, 30, 0}, [4]float64{2, 0, 20, 0}))
		c.RecordPods(batch("node-b", s, [4]float64{5, 0, 50, 0}))
	}
	v, err := c.Values(hello, t0.Add(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// 3 + 2 + 5 = 10 in every second that exists.
	if !v.HasData || v.Stable != 10 || v.Panic != 10 {
		t.Errorf("values %+v, want stable = panic = 10", v)
	}
}

func TestProxiedRequestsAreNotCountedTwice(t *testing.T) {
	c := New()
	_ = c.Watch(hello, settings(t, nil))
	// The pod has 4 in flight, 3 of them from an activator; the activator
	// reports its 3 itself: 1 + 3 = 4, not 7.
	c.RecordPods(batch("node-a", 0, [4]float64{4, 3, 40, 30}))
	c.RecordTargets(&stats.Batch{Node: "activator-0", Start: t0, Period: time.Second,
		Targets: []stats.TargetStat{{Namespace: hello.Namespace, Workload: hello.Name, Concurrency: 3, Requests: 30}}})
	v, _ := c.Values(hello, t0)
	if v.Stable != 4 {
		t.Errorf("stable %v, want 4", v.Stable)
	}
	rps := settings(t, &config.Overrides{Metric: ptr(config.MetricRPS)})
	_ = c.Watch(hello, rps)
	if v, _ := c.Values(hello, t0); v.Stable != 40 {
		t.Errorf("rps %v, want 10 direct + 30 through the activator = 40", v.Stable)
	}
}

func ptr[T any](v T) *T { return &v }

// TestRecordTargetsReportsHeldLoad: an activator's batch names the watched
// targets with requests held, for the caller to poke; idle and unwatched
// targets are not named.
func TestRecordTargetsReportsHeldLoad(t *testing.T) {
	c := New()
	_ = c.Watch(hello, settings(t, nil))
	idle := Key{Namespace: hello.Namespace, Name: "idle"}
	_ = c.Watch(idle, settings(t, nil))
	got := c.RecordTargets(&stats.Batch{Node: "activator-0", Start: t0, Period: time.Second, Targets: []stats.TargetStat{
		{Namespace: hello.Namespace, Workload: hello.Name, Concurrency: 1},
		{Namespace: idle.Namespace, Workload: idle.Name, Concurrency: 0, Requests: 2},
		{Namespace: "elsewhere", Workload: "unwatched", Concurrency: 5},
	}})
	if diff := cmp.Diff([]Key{hello}, got); diff != "" {
		t.Errorf("active targets (-want +got):\n%s", diff)
	}
}

func TestNoDataAndAgeing(t *testing.T) {
	c := New()
	_ = c.Watch(hello, settings(t, nil))
	if v, _ := c.Values(hello, t0); v.HasData {
		t.Error("a target nobody reported on has data")
	}
	c.RecordPods(batch("node-a", 0, [4]float64{6, 0, 6, 0}))
	// The agent disappears: a minute later its pod's load has aged out.
	v, _ := c.Values(hello, t0.Add(61*time.Second))
	if !v.HasData || v.Stable != 0 || v.Panic != 0 {
		t.Errorf("a minute after the last report: %+v, want data with 0 load", v)
	}
	if _, err := c.Values(Key{"ns", "other"}, t0); err == nil || !strings.Contains(err.Error(), "ns/other: not watched") {
		t.Errorf("unwatched target: err = %v", err)
	}
}

func TestActiveTargetsForPoke(t *testing.T) {
	c := New()
	_ = c.Watch(hello, settings(t, nil))
	if got := c.RecordPods(batch("node-a", 0, [4]float64{0, 0, 0, 0})); len(got) != 0 {
		t.Errorf("idle batch marked %v active", got)
	}
	got := c.RecordPods(batch("node-a", 1, [4]float64{1, 0, 1, 0}, [4]float64{2, 0, 2, 0}))
	if len(got) != 1 || got[0] != hello {
		t.Errorf("active = %v, want [ns/hello] once", got)
	}
	other := batch("node-a", 1, [4]float64{5, 0, 5, 0})
	other.Pods[0].Workload = "unwatched"
	if got := c.RecordPods(other); len(got) != 0 {
		t.Errorf("unwatched target reported active: %v", got)
	}
}

func TestConcurrentUse(t *testing.T) {
	c := New()
	_ = c.Watch(hello, settings(t, nil))
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for s := range 100 {
				c.RecordPods(batch("node-"+string(rune('a'+g)), s, [4]float64{1, 0, 1, 0}))
				_, _ = c.Values(hello, t0.Add(time.Duration(s)*time.Second))
			}
		})
	}
	wg.Wait()
	if v, _ := c.Values(hello, t0.Add(99*time.Second)); v.Stable != 4 {
		t.Errorf("four agents with one request each: stable %v, want 4", v.Stable)
	}
}

// BenchmarkIngest5000Agents is one second of stats from 5,000 nodes with
// 100 pods each, spread over 10,000 targets.
func BenchmarkIngest5000Agents(b *testing.B) {
	c := New()
	s, _ := config.Effective(config.Defaults(), 0, nil, nil)
	batches := make([]*stats.Batch, 5000)
	for n := range batches {
		bt := &stats.Batch{Node: "n", Start: t0, Period: time.Second}
		for p := range 100 {
			w := "t" + strconv.Itoa((n*100+p)%10000)
			bt.Pods = append(bt.Pods, stats.PodStat{Namespace: "ns", Workload: w, Concurrency: 1, Requests: 10})
		}
		batches[n] = bt
	}
	for i := range 10000 {
		_ = c.Watch(Key{"ns", "t" + strconv.Itoa(i)}, s)
	}
	sec := 0
	for b.Loop() {
		for _, bt := range batches {
			bt.Start = t0.Add(time.Duration(sec) * time.Second)
			c.RecordPods(bt)
		}
		sec++
	}
}
