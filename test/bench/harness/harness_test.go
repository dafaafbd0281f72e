package harness

import (
	"strings"
	"testing"
	"time"
)

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
			if got := Percentile(tt.ds, tt.p); got != tt.want {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tt.ds, tt.p, got, tt.want)
			}
		})
	}
	if twenty[0] != 20*time.Millisecond {
		t.Errorf("Percentile sorted its argument in place")
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
	m, err := ParseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		metric string
		labels []string
		want   float64
	}{
		{"one series", "sockscale_activator_requests_in_flight", []string{"namespace", "default", "name", "hold", "state", "held"}, 10000},
		{"summed over the labels not given", "sockscale_activator_requests_in_flight", []string{"namespace", "default", "name", "hold"}, 10003},
		{"every series", "sockscale_activator_requests_in_flight", nil, 10005},
		{"counter", "sockscale_activator_probes_total", []string{"result", "error"}, 7},
		{"no labels", "go_goroutines", nil, 20012},
		{"a summary's count", "go_gc_duration_seconds", nil, 1234},
		{"no such series: 0", "sockscale_activator_requests_in_flight", []string{"namespace", "default", "name", "cold", "state", "held"}, 0},
		{"no such metric: 0", "sockscale_activator_pods", nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := m.Value(tt.metric, tt.labels...); got != tt.want {
				t.Errorf("Value(%s, %q) = %v, want %v", tt.metric, tt.labels, got, tt.want)
			}
		})
	}
}
