package main

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/kubernetes"

	"github.com/sockscale/sockscale/test/bench/harness"
)

// This file reads what the scale benchmark reports: Prometheus
// histograms and counters of the controller and the API server, and
// processes' CPU.

// histogram is one Prometheus histogram's buckets: bounds ascending, and
// counts cumulative, one per bound and a last one for +Inf (the total).
type histogram struct {
	bounds []float64
	counts []float64
}

// histogramOf is the sum of histogram name's series in s that carry
// every label name/value pair of labels (empty if none).
func histogramOf(s harness.PromSamples, name string, labels ...string) histogram {
	var h histogram
	f := s[name]
	if f == nil {
		return h
	}
	for _, m := range f.GetMetric() {
		ph := m.GetHistogram()
		if ph == nil || !hasLabels(m.GetLabel(), labels) {
			continue
		}
		if h.bounds == nil {
			for _, b := range ph.GetBucket() {
				if !math.IsInf(b.GetUpperBound(), 1) {
					h.bounds = append(h.bounds, b.GetUpperBound())
				}
			}
			h.counts = make([]float64, len(h.bounds)+1)
		}
		for i, b := range ph.GetBucket() {
			if i < len(h.bounds) {
				h.counts[i] += float64(b.GetCumulativeCount())
			}
		}
		h.counts[len(h.bounds)] += float64(ph.GetSampleCount())
	}
	return h
}

// hasLabels tells whether have holds every name/value pair of want.
func hasLabels(have []*dto.LabelPair, want []string) bool {
	for i := 0; i+1 < len(want); i += 2 {
		found := false
		for _, l := range have {
			if l.GetName() == want[i] && l.GetValue() == want[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// sub is what h counted since old, an earlier scrape of the same series.
func (h histogram) sub(old histogram) histogram {
	d := histogram{bounds: h.bounds, counts: make([]float64, len(h.counts))}
	for i := range h.counts {
		d.counts[i] = h.counts[i]
		if i < len(old.counts) {
			d.counts[i] -= old.counts[i]
		}
	}
	return d
}

func (h histogram) total() float64 {
	if len(h.counts) == 0 {
		return 0
	}
	return h.counts[len(h.counts)-1]
}

// quantile is the q-quantile (0 < q <= 1) as Prometheus'
// histogram_quantile estimates it: linear inside the bucket that holds
// rank q*total, from the bucket's lower bound (0 for the first). A rank
// in the +Inf bucket gives +Inf. NaN without samples. Buckets 1, 2, 3 with
// 10, 30, 40 samples at or below: the p50 is rank 20, the 10th of the 20
// samples in (1, 2], so 1 + 10/20 = 1.5.
func (h histogram) quantile(q float64) float64 {
	total := h.total()
	if total <= 0 {
		return math.NaN()
	}
	rank := q * total
	lower, below := 0.0, 0.0
	for i, bound := range h.bounds {
		if h.counts[i] >= rank {
			in := h.counts[i] - below
			if in <= 0 {
				return bound
			}
			return lower + (bound-lower)*(rank-below)/in
		}
		lower, below = bound, h.counts[i]
	}
	return math.Inf(1)
}

// max is the upper bound of the highest bucket with a sample: the largest
// sample is at most that (+Inf: beyond the last bound). NaN without
// samples.
func (h histogram) max() float64 {
	prev := 0.0
	highest := math.NaN()
	for i, c := range h.counts {
		if c > prev {
			highest = math.Inf(1)
			if i < len(h.bounds) {
				highest = h.bounds[i]
			}
		}
		prev = c
	}
	return highest
}

// seconds prints a histogram's estimate in seconds, "-" for none and
// ">X" beyond the last bound X.
func (h histogram) seconds(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case math.IsInf(v, 1):
		if len(h.bounds) == 0 {
			return "-"
		}
		return fmt.Sprintf(">%gs", h.bounds[len(h.bounds)-1])
	}
	return fmt.Sprintf("%.3gs", v)
}

// writeVerbs are the API server's verbs that change something.
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "DELETE": true, "DELETECOLLECTION": true, "APPLY": true}

// reviewResources are asked by POST but write nothing: the stats
// endpoint's token and access reviews.
var reviewResources = map[string]bool{"tokenreviews": true, "subjectaccessreviews": true}

// apiRequests counts the API server's write requests by
// resource[/subresource] (apiserver_request_total).
func apiRequests(s harness.PromSamples) map[string]float64 {
	out := map[string]float64{}
	f := s["apiserver_request_total"]
	if f == nil {
		return out
	}
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if !writeVerbs[labels["verb"]] {
			continue
		}
		key := labels["resource"]
		if sub := labels["subresource"]; sub != "" {
			key += "/" + sub
		}
		out[key] += m.GetCounter().GetValue()
	}
	return out
}

// writeRates are the writes per second between two apiRequests, split
// into writes and reviews, with the writes by resource (largest first).
func writeRates(before, after map[string]float64, d time.Duration) (writes, reviews float64, by string) {
	type rate struct {
		key string
		v   float64
	}
	var rs []rate
	for k, v := range after {
		r := (v - before[k]) / d.Seconds()
		if r <= 0 {
			continue
		}
		if reviewResources[k] {
			reviews += r
			continue
		}
		writes += r
		rs = append(rs, rate{k, r})
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].v > rs[j].v || rs[i].v == rs[j].v && rs[i].key < rs[j].key })
	var parts []string
	for _, r := range rs {
		parts = append(parts, fmt.Sprintf("%s %.2f/s", r.key, r.v))
	}
	if len(parts) == 0 {
		return writes, reviews, "none"
	}
	return writes, reviews, strings.Join(parts, ", ")
}

// scrapeAPIServer reads the API server's /metrics with cs's credentials.
func scrapeAPIServer(ctx context.Context, cs kubernetes.Interface) (harness.PromSamples, error) {
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("scrape kube-apiserver: %w", err)
	}
	return harness.ParseMetrics(bytes.NewReader(raw))
}

// scrapeURL reads a plain-HTTP /metrics.
func scrapeURL(url string) (harness.PromSamples, error) {
	body, err := harness.Get(url)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	return harness.ParseMetrics(strings.NewReader(body))
}

// childPIDs are this process's children whose command is one of names
// (envtest starts etcd and kube-apiserver but does not say their pids).
func childPIDs(names ...string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(data)
		lp, rp := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if lp < 0 || rp < lp {
			continue
		}
		comm := s[lp+1 : rp]
		f := strings.Fields(s[rp+1:])
		if len(f) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(f[1]); ppid != self {
			continue
		}
		for _, n := range names {
			if comm == n {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// cpuOf is the summed CPU time of pids.
func cpuOf(pids []int) time.Duration {
	var t time.Duration
	for _, p := range pids {
		t += harness.ProcessCPU(p)
	}
	return t
}

// processPeakRSS is a process's peak resident memory (VmHWM) in bytes.
func processPeakRSS(pid int) int64 { return harness.ProcStatusBytes(pid, "VmHWM:") }
