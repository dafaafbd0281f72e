package window

import (
	"math"
	"strings"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func sec(n int) time.Time { return t0.Add(time.Duration(n) * time.Second) }

func mustNew(t testing.TB, d time.Duration) *Buckets {
	t.Helper()
	b, err := New(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestAverageTimelines(t *testing.T) {
	type rec struct {
		at int
		v  float64
	}
	tests := []struct {
		name     string
		records  []rec
		now      int
		window   time.Duration
		want     float64
		wantData bool
	}{
		{"never written is no data", nil, 5, time.Minute, 0, false},
		{"cold start averages over the seconds that exist: (4+8)/2", []rec{{10, 4}, {11, 8}}, 11, time.Minute, 6, true},
		{"a second's samples add up: (3+5)/1", []rec{{10, 3}, {10, 5}}, 10, time.Minute, 8, true},
		{"seconds without writes count as 0 once data exists: 12/4", []rec{{10, 12}}, 13, time.Minute, 3, true},
		{"no write for the whole window is 0", []rec{{10, 12}}, 10 + 60, time.Minute, 0, true},
		{"the panic window is the ring's suffix: 6*60/6", []rec{{0, 1}, {54, 60}, {55, 60}, {56, 60}, {57, 60}, {58, 60}, {59, 60}}, 59, 6 * time.Second, 60, true},
		{"the stable window over the same data: (1+6*60)/60", []rec{{0, 1}, {54, 60}, {55, 60}, {56, 60}, {57, 60}, {58, 60}, {59, 60}}, 59, time.Minute, (1 + 6*60) / 60.0, true},
		{"a late sample lands in its own second: (2+4)/3", []rec{{10, 2}, {12, 0}, {11, 4}}, 12, time.Minute, 2, true},
		{"a sample older than the ring is dropped", []rec{{100, 6}, {30, 1000}}, 100, time.Minute, 6, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustNew(t, time.Minute)
			for _, r := range tt.records {
				b.Record(sec(r.at), r.v)
			}
			got, ok := b.Average(sec(tt.now), tt.window)
			if ok != tt.wantData || !near(got, tt.want) {
				t.Errorf("Average = %v, %v; want %v, %v", got, ok, tt.want, tt.wantData)
			}
		})
	}
}

func TestSteadyLoadOverManyRings(t *testing.T) {
	b := mustNew(t, time.Minute)
	for s := range 300 {
		b.Record(sec(s), 10)
		if got, _ := b.Average(sec(s), time.Minute); !near(got, 10) {
			t.Fatalf("at %ds: average %v, want 10", s, got)
		}
	}
	// The load stops: 30 s later half the window is empty.
	if got, _ := b.Average(sec(299+30), time.Minute); !near(got, 5) {
		t.Errorf("30s after the load stopped: %v, want 5", got)
	}
}

func TestWeightedAverage(t *testing.T) {
	b := mustNew(t, time.Minute)
	for s := range 60 {
		b.Record(sec(s), 7)
	}
	if got, _ := b.WeightedAverage(sec(59), time.Minute); !near(got, 7) {
		t.Errorf("constant load: weighted %v, want 7", got)
	}
	// A step up in the newest seconds shows more in the weighted average
	// (a = 0.2 for 60 buckets: the last 5 seconds weigh 1-0.8^5 = 67 %).
	for s := 55; s < 60; s++ {
		b.Record(sec(s), 100-7)
	}
	lin, _ := b.Average(sec(59), time.Minute)
	w, _ := b.WeightedAverage(sec(59), time.Minute)
	if !near(lin, 7+5*93/60.0) {
		t.Errorf("linear = %v, want %v", lin, 7+5*93/60.0)
	}
	wantW := 7 + 93*(1-math.Pow(0.8, 5))/(1-math.Pow(0.8, 60))
	if math.Abs(w-wantW) > 1e-6 {
		t.Errorf("weighted = %v, want %v", w, wantW)
	}
	if _, ok := mustNew(t, time.Minute).WeightedAverage(sec(0), time.Minute); ok {
		t.Error("weighted average of nothing reports data")
	}
}

func TestResizeKeepsRecentSeconds(t *testing.T) {
	b := mustNew(t, time.Minute)
	for s := range 60 {
		b.Record(sec(s), float64(s))
	}
	if err := b.Resize(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	// Seconds 50..59 remain: mean 54.5.
	if got, _ := b.Average(sec(59), 10*time.Second); !near(got, 54.5) {
		t.Errorf("after shrinking: %v, want 54.5", got)
	}
	if err := b.Resize(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	b.Record(sec(60), 0)
	// 50..60 hold data; the ring's first write was at 0, so the window of
	// 120 s counts 61 seconds: (50+...+59)/61.
	if got, _ := b.Average(sec(60), 2*time.Minute); !near(got, 545.0/61) {
		t.Errorf("after growing: %v, want %v", got, 545.0/61)
	}
}

func TestBadLengths(t *testing.T) {
	for _, d := range []time.Duration{0, 500 * time.Millisecond, 1500 * time.Millisecond, 25 * time.Hour} {
		_, err := New(d)
		if err == nil || !strings.Contains(err.Error(), "whole seconds between 1s and 24h") {
			t.Errorf("New(%v): err = %v", d, err)
		}
	}
}

// BenchmarkRecordAndAverage is one target's work per second: one sample,
// a stable and a panic average.
func BenchmarkRecordAndAverage(b *testing.B) {
	w := mustNew(b, time.Minute)
	s := 0
	for b.Loop() {
		w.Record(sec(s), 3)
		w.Average(sec(s), time.Minute)
		w.Average(sec(s), 6*time.Second)
		s++
	}
}
