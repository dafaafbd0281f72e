package main

import (
	"cmp"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Steps of a cold start, in the order they are expected, as offsets from
// the request.
const (
	stScaled    = "scaled (/scale)"
	stCreated   = "pod created"
	stScheduled = "scheduled"
	stSandbox   = "sandbox ready"
	stPodIP     = "pod IP"
	stRunning   = "container running"
	stEndpoint  = "endpoint published"
	stListening = "app listening"
	stAnswer    = "first answer"
	stReady     = "Ready (kubelet)"
)

// stepAt is one step of one sample.
type stepAt struct {
	what string
	at   time.Duration // since the request
	seen bool
}

// stepOffsets are the sample's steps since its request: those the watches
// saw, when the app began listening (the answer's arrival less its
// X-Listening-For: the time back to the client, well under a millisecond,
// is in it), the first answer, and Ready.
func stepOffsets(s sample) []stepAt {
	at := func(what string, t time.Time) stepAt {
		if t.IsZero() {
			return stepAt{what: what}
		}
		return stepAt{what, t.Sub(s.start), true}
	}
	listening := stepAt{what: stListening}
	if s.listeningFor >= 0 {
		listening = stepAt{stListening, s.end.Sub(s.start) - s.listeningFor, true}
	}
	return []stepAt{
		at(stScaled, s.steps.Scaled), at(stCreated, s.steps.Created), at(stScheduled, s.steps.Scheduled),
		at(stSandbox, s.steps.Sandbox), at(stPodIP, s.steps.PodIP), at(stRunning, s.steps.Running), at(stEndpoint, s.steps.Endpoint), listening,
		{stAnswer, s.end.Sub(s.start), true}, at(stReady, s.steps.Ready),
	}
}

// percentile is the nearest-rank p-quantile of ds (0 < p <= 1); false if
// ds is empty.
func percentile(ds []time.Duration, p float64) (time.Duration, bool) {
	if len(ds) == 0 {
		return 0, false
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)], true
}

// stats are one target's numbers over its samples answered 200.
type stats struct {
	samples, failed int
	firstError      error
	e2e, share      []time.Duration
	// afterEndpoint is the share from the later of the app listening and
	// its address published in the EndpointSlices: from when the
	// activator could know of a pod that answers.
	afterEndpoint []time.Duration
	// steps holds each step's offsets, by name, from the samples that saw
	// it.
	steps map[string][]time.Duration
}

func (r *result) stats() stats {
	st := stats{samples: len(r.samples), steps: map[string][]time.Duration{}}
	for _, s := range r.samples {
		if !s.ok() {
			st.failed++
			if st.firstError == nil {
				st.firstError = s.err
			}
			continue
		}
		st.e2e = append(st.e2e, s.end.Sub(s.start))
		if s.listeningFor >= 0 {
			st.share = append(st.share, s.listeningFor)
			if !s.steps.Endpoint.IsZero() {
				st.afterEndpoint = append(st.afterEndpoint, min(s.listeningFor, s.end.Sub(s.steps.Endpoint)))
			}
		}
		for _, a := range stepOffsets(s) {
			if a.seen {
				st.steps[a.what] = append(st.steps[a.what], a.at)
			}
		}
	}
	return st
}

// stretch is the time between two steps' p50 offsets.
type stretch struct {
	from, to string
	d        time.Duration
}

// stretches are the steps on the request's path (Ready is not: the
// activator does not wait for it) ordered by their p50 offset, as the
// time from the previous one (the first from the request).
func (st stats) stretches() []stretch {
	type p50 struct {
		what string
		at   time.Duration
	}
	var ps []p50
	for _, what := range []string{stScaled, stCreated, stScheduled, stSandbox, stPodIP, stRunning, stEndpoint, stListening, stAnswer} {
		if d, ok := percentile(st.steps[what], 0.5); ok {
			ps = append(ps, p50{what, d})
		}
	}
	slices.SortStableFunc(ps, func(a, b p50) int { return cmp.Compare(a.at, b.at) })
	var out []stretch
	prev := p50{"request", 0}
	for _, p := range ps {
		out = append(out, stretch{prev.what, p.what, p.at - prev.at})
		prev = p
	}
	return out
}

// dominates names the two longest stretches and their share of the p50
// end to end.
func (st stats) dominates() string {
	e2e, ok := percentile(st.e2e, 0.5)
	if !ok || e2e <= 0 {
		return "no sample answered"
	}
	ss := st.stretches()
	slices.SortStableFunc(ss, func(a, b stretch) int { return cmp.Compare(b.d, a.d) })
	var parts []string
	for _, s := range ss[:min(2, len(ss))] {
		parts = append(parts, fmt.Sprintf("%s -> %s %s (%.0f %%)", s.from, s.to, ms(s.d), 100*float64(s.d)/float64(e2e)))
	}
	return strings.Join(parts, ", then ") + " of the p50 " + ms(e2e)
}

// ms is d in milliseconds: one decimal below 10 ms, whole above.
func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	if math.Abs(v) < 10 {
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.0f ms", v)
}

// writeTable prints the targets side by side.
func writeTable(w io.Writer, f *flags, results []*result, loadBefore, loadAfter string) {
	fmt.Fprintf(w, "Cold start on the local cluster: one request to a target at zero (no pod, public Service on the activators) until its 200, on a new connection from this host\n")
	fmt.Fprintf(w, "to the public Service's ClusterIP, timeout %s; the autoscale app (a static Go HTTP server, image on the node, --shutdown-delay=0s); one cold start measured at a time.\n", f.timeout)
	fmt.Fprintf(w, "Scale to zero: autoscaler.stable-window=%s, autoscaler.scale-to-zero-grace-period=%s (the least the controller accepts: 6s, 1s). Load average %s before, %s after.\n", f.stableWindow, f.grace, loadBefore, loadAfter)
	fmt.Fprintf(w, "activator share: the app's X-Listening-For on the first answer (its listener opening -> the held request's arrival). Steps: p50 offset from the request, as watches saw them\n")
	fmt.Fprintf(w, "(n: samples that saw the step, if not all); app listening = first answer - X-Listening-For. after the endpoint: the share from the later of app listening and endpoint published.\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	sts := make([]stats, len(results))
	header := []string{""}
	for i, r := range results {
		sts[i] = r.stats()
		header = append(header, fmt.Sprintf("%s node (%s)", r.t.kind, r.t.node))
	}
	row := func(label string, cell func(st stats) string) {
		cells := []string{label}
		for _, st := range sts {
			cells = append(cells, cell(st))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	q := func(ds []time.Duration, p float64) string {
		d, ok := percentile(ds, p)
		if !ok {
			return "-"
		}
		return ms(d)
	}
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	row("samples", func(st stats) string { return fmt.Sprint(st.samples) })
	row("failed (not 200)", func(st stats) string { return fmt.Sprint(st.failed) })
	row("end to end p50", func(st stats) string { return q(st.e2e, 0.5) })
	row("end to end p95", func(st stats) string { return q(st.e2e, 0.95) })
	row("end to end max", func(st stats) string { return q(st.e2e, 1) })
	row("activator share p50", func(st stats) string { return q(st.share, 0.5) })
	row("activator share p95", func(st stats) string { return q(st.share, 0.95) })
	row("  after the endpoint p50", func(st stats) string { return q(st.afterEndpoint, 0.5) })
	row("  after the endpoint p95", func(st stats) string { return q(st.afterEndpoint, 0.95) })
	for _, what := range []string{stScaled, stCreated, stScheduled, stSandbox, stPodIP, stRunning, stEndpoint, stListening, stAnswer, stReady} {
		row(what+" p50", func(st stats) string {
			v := q(st.steps[what], 0.5)
			if n := len(st.steps[what]); n < len(st.e2e) {
				v += fmt.Sprintf(" (n %d)", n)
			}
			return v
		})
	}
	_ = tw.Flush()
	for i, r := range results {
		fmt.Fprintf(w, "Dominates on the %s node: %s.\n", r.t.kind, sts[i].dominates())
	}
	for i, r := range results {
		if sts[i].failed > 0 {
			fmt.Fprintf(w, "%s node: %d of %d not answered 200; the first: %v\n", r.t.kind, sts[i].failed, sts[i].samples, sts[i].firstError)
		}
	}
}
