package main

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// What the rollout scene keeps, on one clock: durations from the template
// change (t0), negative before it.

// splitStep is the Route's status.traffic from At on, as the demo's watch
// saw it change: the two revisions' percents and the Route's Ready.
type splitStep struct {
	At     time.Duration
	V1, V2 int64
	Ready  string // e.g. "True", "Unknown RolloutInProgress"
}

// second is one second of the in-node clients' connections, by when each
// started, [At, At+1s): those answered by a pod of v1 or v2, by a pod of
// neither, and those that failed.
type second struct {
	At                    time.Duration
	V1, V2, Other, Failed int
}

// answered is the second's connections answered by v1 or v2.
func (s second) answered() int { return s.V1 + s.V2 }

// podsAt is each revision's ready pods at At.
type podsAt struct {
	At     time.Duration
	V1, V2 int
}

// rolloutRecord is the scene for the plot: the schedule, the measured
// seconds, the pods and the moments to mark.
type rolloutRecord struct {
	V1, V2  string // the revisions' names
	Steps   []splitStep
	Seconds []second
	Pods    []podsAt
	Markers []Marker
	// End is when the scene stopped measuring.
	End time.Duration
}

// splitAt is the step in effect at at; false before the first.
func splitAt(steps []splitStep, at time.Duration) (splitStep, bool) {
	var cur splitStep
	found := false
	for _, st := range steps {
		if st.At > at {
			break
		}
		cur, found = st, true
	}
	return cur, found
}

// changedIn says whether the split changed in (from, to].
func changedIn(steps []splitStep, from, to time.Duration) bool {
	for i, st := range steps {
		if i > 0 && st.At > from && st.At <= to && (st.V1 != steps[i-1].V1 || st.V2 != steps[i-1].V2) {
			return true
		}
	}
	return false
}

// bin counts the connections by the second they started in, for the
// seconds from (inclusive) to to (exclusive) after t0.
func bin(conns []conn, t0 time.Time, v1, v2 string, from, to int) []second {
	if to <= from {
		return nil
	}
	out := make([]second, to-from)
	for i := range out {
		out[i].At = time.Duration(from+i) * time.Second
	}
	for _, c := range conns {
		d := c.At.Sub(t0)
		k := int(math.Floor(d.Seconds()))
		if k < from || k >= to {
			continue
		}
		s := &out[k-from]
		switch rev := c.revision(); {
		case c.Err != "":
			s.Failed++
		case rev == v1:
			s.V1++
		case rev == v2:
			s.V2++
		default:
			s.Other++
		}
	}
	return out
}

// window compares the schedule with what was measured over a stretch of
// the scene: scheduled is v2's percent in effect when each connection
// started, averaged over the connections; measured is the percent of them
// v2 answered.
type window struct {
	From, To            time.Duration
	Scheduled, Measured float64
	N                   int
}

// windows cuts [from, end) into windows of width and compares each; a
// window without connections answered by v1 or v2 is left out.
func windows(steps []splitStep, conns []conn, t0 time.Time, v1, v2 string, width, from, end time.Duration) []window {
	var out []window
	for lo := from; lo < end; lo += width {
		hi := min(lo+width, end)
		w := window{From: lo, To: hi}
		var sched, hits float64
		for _, c := range conns {
			at := c.At.Sub(t0)
			rev := c.revision()
			if at < lo || at >= hi || c.Err != "" || (rev != v1 && rev != v2) {
				continue
			}
			st, ok := splitAt(steps, at)
			if !ok {
				continue
			}
			w.N++
			sched += float64(st.V2)
			if rev == v2 {
				hits++
			}
		}
		if w.N > 0 {
			w.Scheduled, w.Measured = sched/float64(w.N), 100*hits/float64(w.N)
			out = append(out, w)
		}
	}
	return out
}

// The live table: a line per second.
const (
	rolloutHeader = "%6s %16s %15s %6s %7s %11s  %s\n"
	rolloutRow    = "%6s %16s %15s %6d %7d %11s  %s\n"
)

// rolloutLine is one second's line: its start, the split in effect at
// its end ("*": it changed during the second), the share of the
// second's connections each revision answered, their number, the failed
// ones, the ready pods of each revision and the Route's Ready.
func rolloutLine(s second, steps []splitStep, pods podsAt) string {
	sched := "-"
	ready := "-"
	if st, ok := splitAt(steps, s.At+time.Second); ok {
		sched = fmt.Sprintf("%d/%d", st.V1, st.V2)
		if changedIn(steps, s.At, s.At+time.Second) {
			sched += "*"
		}
		ready = st.Ready
	}
	measured := "-"
	if n := s.answered(); n > 0 {
		p2 := int(math.Round(100 * float64(s.V2) / float64(n)))
		measured = fmt.Sprintf("%d/%d", 100-p2, p2)
	}
	return fmt.Sprintf(rolloutRow, fmt.Sprintf("%ds", int(s.At.Seconds())), sched, measured, s.answered()+s.Other+s.Failed, s.Failed,
		fmt.Sprintf("%d/%d", pods.V1, pods.V2), ready)
}

func rolloutHeaderLine() string {
	return fmt.Sprintf(rolloutHeader, "time", "scheduled v1/v2", "measured v1/v2", "conns", "failed", "pods v1/v2", "Route Ready")
}

// windowTable is the windows as a table.
func windowTable(ws []window) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  %8s %8s %14s %13s %6s\n", "from", "to", "scheduled v2", "measured v2", "conns")
	for _, w := range ws {
		fmt.Fprintf(&b, "  %7.0fs %7.0fs %13.1f%% %12.1f%% %6d\n", w.From.Seconds(), w.To.Seconds(), w.Scheduled, w.Measured, w.N)
	}
	return b.String()
}
