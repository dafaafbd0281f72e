package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// An activator's /metrics text: demo/hello's series are read, another
// target's are not.
const activatorText = `# HELP sockscale_activator_requests_in_flight Requests this activator has for a target, by state.
# TYPE sockscale_activator_requests_in_flight gauge
sockscale_activator_requests_in_flight{name="hello",namespace="demo",state="forwarded"} 2
sockscale_activator_requests_in_flight{name="hello",namespace="demo",state="held"} 7
sockscale_activator_requests_in_flight{name="other",namespace="demo",state="held"} 100
# HELP sockscale_activator_pods A target's ready pods known to this activator.
# TYPE sockscale_activator_pods gauge
sockscale_activator_pods{name="hello",namespace="demo",state="assigned"} 1
sockscale_activator_pods{name="hello",namespace="demo",state="ready"} 1
# HELP sockscale_activator_hold_results_total Requests that asked for a pod slot, by result.
# TYPE sockscale_activator_hold_results_total counter
sockscale_activator_hold_results_total{name="hello",namespace="demo",result="deadline"} 3
sockscale_activator_hold_results_total{name="hello",namespace="demo",result="forwarded"} 12
# HELP sockscale_activator_cold_start_duration_seconds First request held -> first handed to a pod.
# TYPE sockscale_activator_cold_start_duration_seconds histogram
sockscale_activator_cold_start_duration_seconds_bucket{name="hello",namespace="demo",le="0.1"} 0
sockscale_activator_cold_start_duration_seconds_bucket{name="hello",namespace="demo",le="0.25"} 2
sockscale_activator_cold_start_duration_seconds_bucket{name="hello",namespace="demo",le="+Inf"} 2
sockscale_activator_cold_start_duration_seconds_sum{name="hello",namespace="demo"} 0.25
sockscale_activator_cold_start_duration_seconds_count{name="hello",namespace="demo"} 2
`

func TestParseActivatorMetrics(t *testing.T) {
	for _, tc := range []struct {
		name, text, ns, target string
		want                   actStats
	}{
		{"the target's series", activatorText, "demo", "hello", actStats{Held: 7, Forwarding: 2, ReadyPods: 1, Forwarded: 12, ColdStartSum: 0.25, ColdStartCount: 2}},
		{"no series for the target yet", activatorText, "demo", "nothing", actStats{}},
		{"no activator series at all", "# TYPE go_goroutines gauge\ngo_goroutines 12\n", "demo", "hello", actStats{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseActivatorMetrics(strings.NewReader(tc.text), tc.ns, tc.target)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got)\n%s", diff)
			}
		})
	}
}

// Each activator's cold starts are the histogram's growth during the
// timeline; an activator that held nothing is left out.
func TestColdStarts(t *testing.T) {
	tl := &actTimeline{
		before: map[string]actStats{"act-a": {ColdStartSum: 1, ColdStartCount: 1}, "act-b": {}},
		after:  map[string]actStats{"act-a": {ColdStartSum: 1.127, ColdStartCount: 2}, "act-b": {}, "act-c": {ColdStartSum: 0.3, ColdStartCount: 2}},
	}
	want := []string{"127 ms on act-a", "150 ms on average of 2 on act-c"}
	if diff := cmp.Diff(want, tl.coldStarts()); diff != "" {
		t.Errorf("(-want +got)\n%s", diff)
	}
}
