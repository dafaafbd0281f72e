package recentload

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/sockscale/sockscale/internal/stats"
)

// fleet is the batches of agents nodes, each with podsPerNode pods spread
// over 100 Deployments of ns, with names as long as a Deployment's pods'
// (hello-<10 hex>-<5 chars>: 22 bytes).
func fleet(nodes, podsPerNode int) []*stats.Batch {
	batches := make([]*stats.Batch, nodes)
	for n := range nodes {
		b := &stats.Batch{Node: fmt.Sprintf("node-%05d", n), Period: time.Second}
		for i := range podsPerNode {
			b.Pods = append(b.Pods, stats.PodStat{
				IP: netip.AddrFrom4([4]byte{10, byte(n >> 8), byte(n), byte(i)}), Namespace: "ns",
				Pod: fmt.Sprintf("hello-%010x-%05d", n, i), Workload: fmt.Sprintf("hello-%02d", i%100),
				Concurrency: 2, Requests: 20,
			})
		}
		batches[n] = b
	}
	return batches
}

// TestBytesPerPod measures what the store holds per pod: its entry, its
// name, its shard's and its target's map entries. The Store's comment
// quotes it; more than 512 bytes means something grew.
func TestBytesPerPod(t *testing.T) {
	if size := unsafe.Sizeof(pod{}); size > 320 {
		t.Errorf("a pod's entry is %d bytes, want at most 320 (the size class it is laid out for)", size)
	}
	const nodes, podsPerNode = 500, 100
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s, clk := newStore(t, time.Minute)
	// The batches are garbage once recorded: the store keeps only their
	// pod names.
	func() {
		batches := fleet(nodes, podsPerNode)
		for range 3 {
			clk.Step(time.Second)
			for _, b := range batches {
				s.RecordPods(b.Node, b)
			}
		}
	}()
	runtime.GC()
	runtime.ReadMemStats(&after)
	perPod := float64(after.HeapAlloc-before.HeapAlloc) / (nodes * podsPerNode)
	runtime.KeepAlive(s)
	t.Logf("%.0f bytes per pod (%d pods)", perPod, nodes*podsPerNode)
	if perPod > 512 {
		t.Errorf("%.0f bytes per pod, want at most 512", perPod)
	}
}

// BenchmarkRecordPods is one agent's batch of 100 pods into a store that
// holds 50,000.
func BenchmarkRecordPods(b *testing.B) {
	s, clk := newStore(b, time.Minute)
	batches := fleet(500, 100)
	for _, batch := range batches {
		s.RecordPods(batch.Node, batch)
	}
	i := 0
	for b.Loop() {
		if i%len(batches) == 0 {
			clk.Step(time.Second)
		}
		batch := batches[i%len(batches)]
		s.RecordPods(batch.Node, batch)
		i++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(i*100), "ns/record")
}

// BenchmarkTarget is a read of a target of 500 pods among 50,000.
func BenchmarkTarget(b *testing.B) {
	s, clk := newStore(b, time.Minute)
	for _, batch := range fleet(500, 100) {
		s.RecordPods(batch.Node, batch)
	}
	clk.Step(time.Second)
	for b.Loop() {
		if l, ok := s.Target("ns", "hello-07", nil); !ok || l.Pods != 500 {
			b.Fatalf("Target = %+v, %v; want 500 pods", l, ok)
		}
	}
}
