package main

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestHistogramQuantile(t *testing.T) {
	// Buckets 1, 2, 3 and +Inf; counts cumulative.
	h := func(counts ...float64) histogram { return histogram{bounds: []float64{1, 2, 3}, counts: counts} }
	tests := []struct {
		name string
		h    histogram
		q    float64
		want float64
	}{
		// 10 at or below 1, 20 in (1, 2]: rank 20 is the 10th of those
		// 20, so 1 + 10/20.
		{"inside a bucket", h(10, 30, 40, 40), 0.5, 1.5},
		// Rank 5 of 10 in the first bucket, which starts at 0.
		{"first bucket from zero", h(10, 10, 10, 10), 0.5, 0.5},
		// Rank 39.6 of 40: 9.6 of the 10 in (2, 3].
		{"p99", h(10, 30, 40, 40), 0.99, 2.96},
		// Empty buckets below the rank are skipped: all 4 in (2, 3].
		{"after empty buckets", h(0, 0, 4, 4), 0.5, 2.5},
		// Beyond the last bound: +Inf.
		{"in +Inf", h(1, 1, 1, 10), 0.5, math.Inf(1)},
		{"no samples", h(0, 0, 0, 0), 0.5, math.NaN()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.h.quantile(tt.q)
			if !(math.IsNaN(tt.want) && math.IsNaN(got)) && math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("quantile(%v) = %v, want %v", tt.q, got, tt.want)
			}
		})
	}
}

func TestHistogramMaxAndSub(t *testing.T) {
	before := histogram{bounds: []float64{1, 2, 3}, counts: []float64{5, 5, 5, 5}}
	after := histogram{bounds: []float64{1, 2, 3}, counts: []float64{9, 12, 12, 12}}
	d := after.sub(before)
	if diff := cmp.Diff([]float64{4, 7, 7, 7}, d.counts); diff != "" {
		t.Errorf("sub (-want +got):\n%s", diff)
	}
	if got := d.max(); got != 2 {
		t.Errorf("max = %v, want 2 (the highest bucket with a sample)", got)
	}
	if got := (histogram{bounds: []float64{1}, counts: []float64{1, 2}}).max(); !math.IsInf(got, 1) {
		t.Errorf("max with a sample beyond the last bound = %v, want +Inf", got)
	}
	if got := d.seconds(math.Inf(1)); got != ">3s" {
		t.Errorf("seconds(+Inf) = %q, want \">3s\"", got)
	}
}

func TestWriteRates(t *testing.T) {
	before := map[string]float64{"podautoscalers/status": 100, "tokenreviews": 10}
	after := map[string]float64{"podautoscalers/status": 160, "tokenreviews": 40, "subjectaccessreviews": 30, "deployments/scale": 6}
	writes, reviews, by := writeRates(before, after, 30*time.Second)
	if writes != 2.2 || reviews != 2 {
		t.Errorf("writes, reviews = %v, %v; want 2.2, 2", writes, reviews)
	}
	if want := "podautoscalers/status 2.00/s, deployments/scale 0.20/s"; by != want {
		t.Errorf("by resource = %q, want %q", by, want)
	}
}

func TestScaleShape(t *testing.T) {
	s := newScaleShape(1000, 50)
	if s.nodes != 500 {
		t.Fatalf("nodes = %d, want 500", s.nodes)
	}
	perNode := make([]int, s.nodes)
	ips := map[string]bool{}
	for i := range s.targets {
		for j := range podsPerTarget {
			perNode[s.podNode(i, j)]++
			ips[podIP(i, j).String()] = true
		}
	}
	for n, c := range perNode {
		if c != podsPerNode {
			t.Fatalf("node %d runs %d pods, want %d", n, c, podsPerNode)
		}
	}
	if len(ips) != s.targets*podsPerTarget {
		t.Errorf("%d distinct pod IPs, want %d", len(ips), s.targets*podsPerTarget)
	}
}
