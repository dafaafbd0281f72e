package main

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sockscale/sockscale/internal/testutil/loadgen"
)

func TestMeanCI(t *testing.T) {
	tests := []struct {
		name           string
		vs             []float64
		mean, halfWant float64
	}{
		// sd = 1.5811, se = 0.7071, t(4) = 2.776: half = 1.963.
		{"five values", []float64{1, 2, 3, 4, 5}, 3, 1.963},
		// sd = 0, so no interval at all.
		{"constant", []float64{7, 7, 7}, 7, 0},
		// 40 alternating values: sd = 0.1013, se = 0.0160, t(39) = 2.023.
		{"beyond the table", alternating(40), 0.5, 0.0324},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mean, lo, hi := meanCI(tt.vs)
			if math.Abs(mean-tt.mean) > 1e-9 {
				t.Errorf("mean = %v, want %v", mean, tt.mean)
			}
			if half := (hi - lo) / 2; math.Abs(half-tt.halfWant) > 0.001 || math.Abs(mean-lo-half) > 1e-9 {
				t.Errorf("interval [%v, %v]: half width %v, want %v around the mean", lo, hi, half, tt.halfWant)
			}
		})
	}
}

// alternating is n values, 0.4 and 0.6 in turn.
func alternating(n int) []float64 {
	vs := make([]float64, n)
	for i := range vs {
		vs[i] = 0.4 + 0.2*float64(i%2)
	}
	return vs
}

func TestParseConcurrencies(t *testing.T) {
	got, err := parseConcurrencies("-c", "1, 16,64")
	if err != nil || !slices.Equal(got, []int{1, 16, 64}) {
		t.Errorf("parseConcurrencies(\"1, 16,64\") = %v, %v; want [1 16 64]", got, err)
	}
	for _, bad := range []string{"", "0", "1,,2", "-4", "x"} {
		if _, err := parseConcurrencies("-c", bad); err == nil {
			t.Errorf("parseConcurrencies(%q): no error", bad)
		}
	}
}

func TestParseDurations(t *testing.T) {
	got, err := parseDurations("25ms, 15ms")
	if err != nil || !slices.Equal(got, []time.Duration{25 * time.Millisecond, 15 * time.Millisecond}) {
		t.Errorf("parseDurations(\"25ms, 15ms\") = %v, %v; want [25ms 15ms]", got, err)
	}
	for _, bad := range []string{"", "0s", "25", "-1ms", "25ms,,15ms"} {
		if _, err := parseDurations(bad); err == nil {
			t.Errorf("parseDurations(%q): no error", bad)
		}
	}
}

func TestRoundMeans(t *testing.T) {
	// Two rounds: the proxy at half and then a quarter of direct's rps,
	// with 100 and 300 µs more CPU per request.
	r := func(completed int64, cpu time.Duration) result {
		return result{Result: &loadgen.Result{Completed: completed, Elapsed: time.Second}, cpu: cpu}
	}
	rs := map[string][]result{
		"direct": {r(1000, 100*time.Millisecond), r(1000, 100*time.Millisecond)},
		"proxy":  {r(500, 100*time.Millisecond), r(250, 100*time.Millisecond)},
	}
	got := roundMeans(rs, []string{"direct", "proxy"}, "direct")
	// log ratio: (log 0.5 + log 0.25) / 2 = log(0.3536); CPU: (+100 + +300) / 2 µs.
	if g := got["proxy"]; math.Abs(math.Exp(g[logRatio])-math.Sqrt(0.125)) > 1e-9 || math.Abs(g[extraCPU]-200e3) > 1e-6 {
		t.Errorf("proxy vs direct: rps ratio %v, extra CPU %v ns; want 0.3536, 200000", math.Exp(g[logRatio]), g[extraCPU])
	}
	if g := got["direct"]; g[logRatio] != 0 || g[extraCPU] != 0 {
		t.Errorf("direct vs itself: %v, want zeros", g)
	}
}

func TestShare(t *testing.T) {
	// 10 over 4: the first two connections carry one more.
	var got []int
	for i := range 4 {
		got = append(got, share(10, 4, i))
	}
	if !slices.Equal(got, []int{3, 3, 2, 2}) {
		t.Errorf("share(10, 4, i) = %v, want [3 3 2 2]", got)
	}
}

func TestAddResult(t *testing.T) {
	all := &loadgen.Result{}
	addResult(all, &loadgen.Result{Completed: 3, Elapsed: 2 * time.Second, Latencies: []time.Duration{1, 2, 3}})
	addResult(all, &loadgen.Result{Completed: 1, Failed: 1, FirstError: errors.New("reset"), Elapsed: time.Second, Latencies: []time.Duration{4}})
	// Loops that ran side by side: counts add up, the elapsed time is the longest.
	if all.Completed != 4 || all.Failed != 1 || all.FirstError == nil || all.Elapsed != 2*time.Second || len(all.Latencies) != 4 {
		t.Errorf("merged %+v, want 4 completed, 1 failed with its error, 2s, 4 latencies", all)
	}
}
