package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The breakdown lists the stages in the order they were seen, each with
// its time after the requests were sent and the step from the one before.
func TestBreakdown(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 900_000_000, time.Local)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	b := &burstResult{sent: t0, latencies: []time.Duration{141 * time.Millisecond, 150 * time.Millisecond, 160 * time.Millisecond},
		failed: []string{"503 Service Unavailable: queue full"}, failedAt: []time.Duration{150 * time.Millisecond}, pods: map[string]int{"hello-1": 3}}
	m := &marks{}
	m.mark(stage{name: stKubeReady, at: at(1020), source: srcWatch, api: at(1020).Truncate(time.Second), apiWhat: "Ready"})
	m.mark(stage{key: stScale, name: fmt.Sprintf(stScale, 1), at: at(21), source: srcWatch})
	m.mark(stage{key: stScale, name: fmt.Sprintf(stScale, 3), at: at(500), source: srcWatch}) // 1 -> 3 later: the first is kept
	m.mark(stage{name: stCreated, at: at(30), source: srcWatch, api: t0.Truncate(time.Second), apiWhat: "creationTimestamp"})
	m.mark(stage{name: stCreated, at: at(40), source: srcWatch}) // a later pod: the first is kept
	tl := &actTimeline{held: at(4), podReady: at(120), forwarded: at(130),
		before: map[string]actStats{"act-a": {}}, after: map[string]actStats{"act-a": {ColdStartSum: 0.126, ColdStartCount: 1}}}

	bd := newBreakdown(b, m, tl)
	var got []string
	for _, s := range bd.stages {
		got = append(got, fmt.Sprintf("%s %s", ms(s.at.Sub(t0)), s.name))
	}
	want := []string{
		"0 ms " + stSent,
		"4 ms " + stHeld,
		"21 ms /scale written: Deployment spec.replicas 0 -> 1",
		"30 ms " + stCreated,
		"120 ms " + stProbed,
		"130 ms " + stForwarded,
		"141 ms " + stAnswered,
		"150 ms " + stFailed,
		"160 ms " + stLast,
		"1020 ms " + stKubeReady,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stages (-want +got)\n%s", diff)
	}

	var out bytes.Buffer
	bd.write(&out)
	for _, line := range []string{
		"4 requests sent at once at 12:00:00.900; 3 answered 200, 1 failed: 503 Service Unavailable: queue full",
		"pod created (ReplicaSet controller)                       30 ms    +9 ms  watch event                12:00:00 creationTimestamp",
		"whole first request 141 ms (median 150 ms, last 160 ms), client's clock; answered by hello-1 (3)",
		"sockscale_activator_cold_start_duration_seconds): 126 ms on act-a",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("breakdown lacks %q:\n%s", line, out.String())
		}
	}
}
