package main

import (
	"testing"
	"time"

	"github.com/sockscale/sockscale/internal/testutil/loadgen"
)

func TestTimeInAndMaxIn(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	var proxy series[bool]
	proxy.add(at(0), true)
	proxy.add(at(1), true) // no change: no step
	proxy.add(at(5), false)
	proxy.add(at(8), true)
	if len(proxy) != 3 {
		t.Fatalf("%d steps, want 3 (repeats dropped)", len(proxy))
	}
	for _, c := range []struct {
		from, to float64
		want     time.Duration
	}{
		{2, 10, 5 * time.Second}, // 2..5 and 8..10
		{6, 7, 0},
		{-5, 3, 3 * time.Second}, // nothing known before 0
		{9, 12, 3 * time.Second},
	} {
		if got := timeIn(proxy, true, at(c.from), at(c.to)); got != c.want {
			t.Errorf("Proxy within [%v, %v]: %s, want %s", c.from, c.to, got, c.want)
		}
	}
	var ready series[int32]
	ready.add(at(0), 1)
	ready.add(at(3), 9)
	ready.add(at(6), 4)
	for _, c := range []struct {
		from, to float64
		want     int32
	}{
		{1, 2, 1},   // the value in force at from
		{1, 4, 9},   // a step within
		{7, 9, 4},   // the 9 was replaced before the window
		{-2, -1, 0}, // nothing known yet
	} {
		if got := maxIn(ready, at(c.from), at(c.to)); got != c.want {
			t.Errorf("max ready within [%v, %v]: %d, want %d", c.from, c.to, got, c.want)
		}
	}
}

func TestFirstRequests(t *testing.T) {
	from := time.Unix(1000, 0)
	res := &loadgen.Result{
		// A request sent at from and answered after 1.5 s (a cold start),
		// then the same client's next, sent at 1.5 s.
		Latencies: []time.Duration{1500 * time.Millisecond, 60 * time.Millisecond, 1400 * time.Millisecond},
		Spans: []loadgen.Span{
			{End: from.Add(1500 * time.Millisecond)},
			{End: from.Add(1560 * time.Millisecond)},
			{End: from.Add(1405 * time.Millisecond)},
		},
	}
	if got := firstRequests(res, from).Latencies; len(got) != 2 || got[0] != 1500*time.Millisecond || got[1] != 1400*time.Millisecond {
		t.Fatalf("first requests %v, want the two sent at from", got)
	}
}

func TestTargetName(t *testing.T) {
	for _, c := range []struct {
		tbc  float64
		kind clientKind
		want string
	}{
		{211, keepAlive, "tbc211-ka"},
		{0, newConn, "tbc0-nc"},
		{-1, keepAlive, "tbcm1-ka"},
		{0.5, newConn, "tbc0-5-nc"},
	} {
		if got := targetName(c.tbc, c.kind); got != c.want {
			t.Errorf("targetName(%v, %s) = %q, want %q", c.tbc, c.kind, got, c.want)
		}
	}
}
