package main

import (
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"
)

// share is the part of the client's requests the activators forwarded.
func (r row) share() string {
	total := r.res.Completed + r.res.Failed
	if total == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f %%", 100*r.via/float64(total))
}

func (r row) rps() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.res.Completed) / r.elapsed.Seconds()
}

// summary is the row in one line, for the progress output.
func (r row) summary() string {
	return fmt.Sprintf("%.0f req/s, p50 %s p99 %s, %d failed, %d pods, %s via activators, Proxy %s of %s",
		r.rps(), ms(r.res.Percentile(0.5)), ms(r.res.Percentile(0.99)), r.res.Failed, r.pods, r.share(),
		r.proxy.Round(100*time.Millisecond), r.elapsed.Round(100*time.Millisecond))
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + " ms"
}

// writeTable prints the rows by target, the scenarios in the flags' order
// of TBCs and client kinds.
func writeTable(w io.Writer, f *flags, rows []row) {
	fmt.Fprintf(w, "target 10 (7 in flight per pod), max-scale 30, stable window 20 s, app sleep %s; steady %d in flight for %s, burst 1 -> %d in flight within 1 s measured %s, %d clients arriving at zero for %s\n",
		f.sleep, f.steady, f.steadyFor, f.burst, f.burstFor, f.burst, f.zeroFor)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TBC\tclients\tscenario\treq/s\tp50\tp99\tfailed\tpods\tvia activators\tProxy\tfirst requests p50/p99\tnote")
	for _, tbc := range f.tbcs {
		for _, k := range f.kinds {
			for _, sc := range []string{scSteady, scBurst, scZero} {
				for _, r := range rows {
					if r.tbc != tbc || r.kind != k || r.scenario != sc || r.res == nil {
						continue
					}
					cold := "-"
					if r.cold != nil && len(r.cold.Latencies) > 0 {
						cold = fmt.Sprintf("%s / %s (%d)", ms(r.cold.Percentile(0.5)), ms(r.cold.Percentile(0.99)), len(r.cold.Latencies))
					}
					fmt.Fprintf(tw, "%v\t%s\t%s\t%.0f\t%s\t%s\t%d of %d\t%d\t%s\t%s of %s\t%s\t%s\n",
						r.tbc, r.kind, r.scenario, r.rps(), ms(r.res.Percentile(0.5)), ms(r.res.Percentile(0.99)),
						r.res.Failed, r.res.Completed+r.res.Failed, r.pods, r.share(),
						r.proxy.Round(100*time.Millisecond), r.elapsed.Round(time.Second), cold, r.note)
				}
			}
		}
	}
	_ = tw.Flush()
}
