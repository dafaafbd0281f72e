package window

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func mustNew(t testing.TB, d time.Duration) *Ring[float64] {
	t.Helper()
	r, err := New[float64](d)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// read returns seconds from..to (inclusive, newest first) as Get sees
// them; -1 marks a second that does not count.
func read(r *Ring[float64], to, from int64) []float64 {
	var out []float64
	for s := to; s >= from; s-- {
		v, ok := r.Get(s)
		if !ok {
			v = -1
		}
		out = append(out, v)
	}
	return out
}

func TestRingTimelines(t *testing.T) {
	type write struct {
		sec int64
		v   float64
	}
	tests := []struct {
		name     string
		writes   []write
		to, from int64
		want     []float64
	}{
		{"nothing written: nothing counts", nil, 3, 0, []float64{-1, -1, -1, -1}},
		{"a second's writes add up", []write{{10, 3}, {10, 5}}, 10, 10, []float64{8}},
		{"seconds before the first write do not count", []write{{10, 4}, {11, 8}}, 11, 9, []float64{8, 4, -1}},
		{"seconds after the newest count as empty", []write{{10, 12}}, 13, 10, []float64{0, 0, 0, 12}},
		{"seconds skipped by a later write are empty", []write{{10, 2}, {13, 5}}, 13, 10, []float64{5, 0, 0, 2}},
		{"a late write lands in its own second", []write{{10, 2}, {12, 1}, {11, 4}}, 12, 10, []float64{1, 4, 2}},
		{"a write before the first second is dropped", []write{{10, 2}, {9, 100}}, 10, 9, []float64{2, -1}},
		{"a write older than the ring is dropped", []write{{0, 1}, {100, 6}, {30, 1000}}, 100, 99, []float64{6, 0}},
		{"seconds that left the ring do not count", []write{{0, 1}, {5, 2}}, 5, 0, []float64{2, 0, 0, 0, -1, -1}},
		{"a write a whole ring later clears it", []write{{0, 1}, {3, 2}, {20, 3}}, 20, 16, []float64{3, 0, 0, 0, -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustNew(t, 4*time.Second)
			for _, w := range tt.writes {
				if b := r.At(w.sec); b != nil {
					*b += w.v
				}
			}
			if diff := cmp.Diff(tt.want, read(r, tt.to, tt.from)); diff != "" {
				t.Errorf("seconds %d..%d (-want +got):\n%s", tt.to, tt.from, diff)
			}
		})
	}
}

func TestResizeKeepsRecentSeconds(t *testing.T) {
	r := mustNew(t, time.Minute)
	for s := range int64(60) {
		*r.At(s) = float64(s)
	}
	if err := r.Resize(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]float64{59, 58, 57, 56, 55, 54, 53, 52, 51, 50, -1}, read(r, 59, 49)); diff != "" {
		t.Errorf("after shrinking (-want +got):\n%s", diff)
	}
	if err := r.Resize(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	*r.At(60) = 60
	// 50..60 hold data, and the seconds from the first write (0) that the
	// shrink dropped read as empty.
	if got := read(r, 60, 45); !near(got[0], 60) || !near(got[10], 50) || got[11] != 0 {
		t.Errorf("after growing: %v", got)
	}
}

func TestLinear(t *testing.T) {
	tests := []struct {
		name   string
		values []float64
		want   float64
		ok     bool
	}{
		{"nothing", nil, 0, false},
		{"only seconds without a value", []float64{NoData, NoData}, 0, false},
		{"mean", []float64{4, 8}, 6, true},
		{"a second without a value is neither a zero nor counted: (4+8)/2", []float64{4, NoData, 8}, 6, true},
		{"zeros count", []float64{12, 0, 0, 0}, 3, true},
	}
	for _, tt := range tests {
		got, ok := Linear(tt.values)
		if ok != tt.ok || !near(got, tt.want) {
			t.Errorf("%s: %v, %v; want %v, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}

func TestWeightedExponential(t *testing.T) {
	constant := make([]float64, 60)
	for i := range constant {
		constant[i] = 7
	}
	if got, _ := WeightedExponential(constant, 60); !near(got, 7) {
		t.Errorf("constant load: %v, want 7", got)
	}
	// A step up in the newest 5 seconds shows more than in the linear mean
	// (a = 0.2 for 60 s: the newest 5 seconds weigh 1-0.8^5 = 67 %).
	step := append([]float64(nil), constant...)
	for i := range 5 {
		step[i] = 100
	}
	lin, _ := Linear(step)
	w, _ := WeightedExponential(step, 60)
	if !near(lin, 7+5*93/60.0) {
		t.Errorf("linear = %v, want %v", lin, 7+5*93/60.0)
	}
	if want := 7 + 93*(1-math.Pow(0.8, 5))/(1-math.Pow(0.8, 60)); math.Abs(w-want) > 1e-9 {
		t.Errorf("weighted = %v, want %v", w, want)
	}
	// A second without a value keeps its age but no weight: 10 (age 0,
	// weight 0.2) and 20 (age 2, weight 0.2*0.8^2 = 0.128) => (2 + 2.56) / 0.328.
	if got, _ := WeightedExponential([]float64{10, NoData, 20}, 60); !near(got, (2+2.56)/0.328) {
		t.Errorf("with a gap: %v, want %v", got, (2+2.56)/0.328)
	}
	if _, ok := WeightedExponential([]float64{NoData}, 60); ok {
		t.Error("weighted average of nothing reports data")
	}
}

func TestBadLengths(t *testing.T) {
	for _, d := range []time.Duration{0, 500 * time.Millisecond, 1500 * time.Millisecond, 25 * time.Hour} {
		_, err := New[float64](d)
		if err == nil || !strings.Contains(err.Error(), "whole seconds between 1s and 24h") {
			t.Errorf("New(%v): err = %v", d, err)
		}
	}
}

// BenchmarkWriteAndAverage is one target's work per second: one write, a
// stable and a panic average over 60 and 6 seconds.
func BenchmarkWriteAndAverage(b *testing.B) {
	r := mustNew(b, time.Minute)
	values := make([]float64, 60)
	s := int64(0)
	for b.Loop() {
		*r.At(s) += 3
		for age := range values {
			values[age], _ = r.Get(s - int64(age))
		}
		Linear(values)
		Linear(values[:6])
		s++
	}
}
