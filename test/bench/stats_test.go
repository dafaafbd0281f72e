package main

import (
	"math"
	"slices"
	"strings"
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
	got, err := parseConcurrencies("1, 16,64")
	if err != nil || !slices.Equal(got, []int{1, 16, 64}) {
		t.Errorf("parseConcurrencies(\"1, 16,64\") = %v, %v; want [1 16 64]", got, err)
	}
	for _, bad := range []string{"", "0", "1,,2", "-4", "x"} {
		if _, err := parseConcurrencies(bad); err == nil {
			t.Errorf("parseConcurrencies(%q): no error", bad)
		}
	}
}

func TestPercentile(t *testing.T) {
	ms := func(vs ...int) []time.Duration {
		ds := make([]time.Duration, len(vs))
		for i, v := range vs {
			ds[i] = time.Duration(v) * time.Millisecond
		}
		return ds
	}
	twenty := ms(20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1) // any order
	tests := []struct {
		name string
		ds   []time.Duration
		p    float64
		want time.Duration
	}{
		{"none", nil, 0.5, 0},
		{"one", ms(7), 0.95, 7 * time.Millisecond},
		// Nearest rank: ceil(0.5*20) = 10th, ceil(0.95*20) = 19th (not
		// the maximum), ceil(1*20) = 20th.
		{"p50 of 20", twenty, 0.5, 10 * time.Millisecond},
		{"p95 of 20", twenty, 0.95, 19 * time.Millisecond},
		{"max of 20", twenty, 1, 20 * time.Millisecond},
		// ceil(0.95*30) = 29th; ceil(0.5*3) = 2nd.
		{"p95 of 30", ms(30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1), 0.95, 29 * time.Millisecond},
		{"p50 of 3", ms(3, 1, 2), 0.5, 2 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := percentile(tt.ds, tt.p); got != tt.want {
				t.Errorf("percentile(%v, %v) = %v, want %v", tt.ds, tt.p, got, tt.want)
			}
		})
	}
	if twenty[0] != 20*time.Millisecond {
		t.Errorf("percentile sorted its argument in place")
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

func TestPromSamplesValue(t *testing.T) {
	const text = `# TYPE sockscale_activator_requests_in_flight gauge
sockscale_activator_requests_in_flight{name="hold",namespace="default",state="held"} 10000
sockscale_activator_requests_in_flight{name="hold",namespace="default",state="forwarded"} 3
sockscale_activator_requests_in_flight{name="warm",namespace="default",state="held"} 2
# TYPE sockscale_activator_probes_total counter
sockscale_activator_probes_total{result="error"} 7
# TYPE go_goroutines gauge
go_goroutines 20012
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0.5"} 0.0001
go_gc_duration_seconds_sum 0.25
go_gc_duration_seconds_count 1234
`
	m, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		metric string
		labels []string
		want   float64
	}{
		{"one series", "sockscale_activator_requests_in_flight", targetLabels("hold", "state", "held"), 10000},
		{"summed over the labels not given", "sockscale_activator_requests_in_flight", targetLabels("hold"), 10003},
		{"every series", "sockscale_activator_requests_in_flight", nil, 10005},
		{"counter", "sockscale_activator_probes_total", []string{"result", "error"}, 7},
		{"no labels", "go_goroutines", nil, 20012},
		{"a summary's count", "go_gc_duration_seconds", nil, 1234},
		{"no such series: 0", "sockscale_activator_requests_in_flight", targetLabels("cold", "state", "held"), 0},
		{"no such metric: 0", "sockscale_activator_pods", nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := m.value(tt.metric, tt.labels...); got != tt.want {
				t.Errorf("value(%s, %q) = %v, want %v", tt.metric, tt.labels, got, tt.want)
			}
		})
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
