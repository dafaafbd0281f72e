package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/test/stack"
)

// activatorMetricsPort is the chart's activator.ports.metrics.
const activatorMetricsPort = 9090

// actStats are one activator's series for the demo's target, or their sum
// over the activators.
type actStats struct {
	// Held and Forwarding: sockscale_activator_requests_in_flight by state.
	Held, Forwarding float64
	// ReadyPods: sockscale_activator_pods{state="ready"}, the target's pods
	// this activator's probe (or the EndpointSlice) found ready.
	ReadyPods float64
	// Forwarded: sockscale_activator_hold_results_total{result="forwarded"}.
	Forwarded float64
	// ColdStartSum and ColdStartCount: the cold start histogram's sum (s)
	// and count (first request held at zero -> first one handed to a pod).
	ColdStartSum, ColdStartCount float64
}

func (a actStats) add(b actStats) actStats {
	return actStats{a.Held + b.Held, a.Forwarding + b.Forwarding, a.ReadyPods + b.ReadyPods, a.Forwarded + b.Forwarded,
		a.ColdStartSum + b.ColdStartSum, a.ColdStartCount + b.ColdStartCount}
}

// parseActivatorMetrics reads the target ns/name's series from one
// activator's /metrics text.
func parseActivatorMetrics(r io.Reader, ns, name string) (actStats, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return actStats{}, err
	}
	var st actStats
	for _, m := range families["sockscale_activator_requests_in_flight"].GetMetric() {
		if l := labels(m.GetLabel()); l["namespace"] == ns && l["name"] == name {
			switch l["state"] {
			case "held":
				st.Held += m.GetGauge().GetValue()
			case "forwarded":
				st.Forwarding += m.GetGauge().GetValue()
			}
		}
	}
	for _, m := range families["sockscale_activator_pods"].GetMetric() {
		if l := labels(m.GetLabel()); l["namespace"] == ns && l["name"] == name && l["state"] == "ready" {
			st.ReadyPods += m.GetGauge().GetValue()
		}
	}
	for _, m := range families["sockscale_activator_hold_results_total"].GetMetric() {
		if l := labels(m.GetLabel()); l["namespace"] == ns && l["name"] == name && l["result"] == "forwarded" {
			st.Forwarded += m.GetCounter().GetValue()
		}
	}
	for _, m := range families["sockscale_activator_cold_start_duration_seconds"].GetMetric() {
		if l := labels(m.GetLabel()); l["namespace"] == ns && l["name"] == name {
			st.ColdStartSum += m.GetHistogram().GetSampleSum()
			st.ColdStartCount += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return st, nil
}

func labels(ls []*dto.LabelPair) map[string]string {
	out := make(map[string]string, len(ls))
	for _, l := range ls {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// activators scrapes the activator pods' /metrics for one target.
type activators struct {
	s        *stack.Stack
	ns, name string
	hc       *http.Client

	mu sync.Mutex
	// peak is the most requests held seen by Watch since the last row.
	peak float64
}

func newActivators(s *stack.Stack, ns, name string) *activators {
	return &activators{s: s, ns: ns, name: name, hc: stack.MetricsClient(2 * time.Second)}
}

// addrs are the activator pods' metrics addresses by pod name.
func (a *activators) addrs(ctx context.Context) (map[string]string, error) {
	var pods corev1.PodList
	if err := a.s.Client.List(ctx, &pods, client.InNamespace(stack.Namespace), client.MatchingLabels{"app.kubernetes.io/component": "activator"}); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		if ip, err := netip.ParseAddr(p.Status.PodIP); err == nil && p.DeletionTimestamp == nil {
			out[p.Name] = netip.AddrPortFrom(ip, activatorMetricsPort).String()
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no activator pod with an IP")
	}
	return out, nil
}

// scrape reads every activator at addrs at once; the result is by pod.
func (a *activators) scrape(ctx context.Context, addrs map[string]string) (map[string]actStats, error) {
	type res struct {
		pod string
		st  actStats
		err error
	}
	ch := make(chan res, len(addrs))
	for pod, addr := range addrs {
		go func() {
			st, err := a.scrapeOne(ctx, addr)
			ch <- res{pod, st, err}
		}()
	}
	out := make(map[string]actStats, len(addrs))
	var errs []error
	for range addrs {
		r := <-ch
		if r.err != nil {
			errs = append(errs, fmt.Errorf("scrape activator %s: %w", r.pod, r.err))
			continue
		}
		out[r.pod] = r.st
	}
	return out, errors.Join(errs...)
}

func (a *activators) scrapeOne(ctx context.Context, addr string) (actStats, error) {
	// HTTPS with the harness scraper's token (the chart's
	// --metrics-secure).
	req, err := a.s.MetricsRequest(ctx, addr)
	if err != nil {
		return actStats{}, err
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return actStats{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return actStats{}, fmt.Errorf("status %s", resp.Status)
	}
	return parseActivatorMetrics(resp.Body, a.ns, a.name)
}

func sum(byPod map[string]actStats) actStats {
	var t actStats
	for _, st := range byPod {
		t = t.add(st)
	}
	return t
}

// heldNow is the requests the activators hold for the target now, or,
// when higher, the most Watch saw since the last call (a cold start holds
// requests for a fraction of a row's 2 s). -1 when nothing could be read.
func (a *activators) heldNow(ctx context.Context) float64 {
	a.mu.Lock()
	peak := a.peak
	a.peak = 0
	a.mu.Unlock()
	addrs, err := a.addrs(ctx)
	if err != nil {
		return max(peak, -1)
	}
	byPod, err := a.scrape(ctx, addrs)
	if len(byPod) == 0 && err != nil {
		return max(peak, -1)
	}
	return max(peak, sum(byPod).Held)
}

// actTimeline is what Watch saw, on the demo's clock: when each fact was
// first true (zero: never), and the per-activator series at the start and
// at the end.
type actTimeline struct {
	held, podReady, forwarded time.Time
	before, after             map[string]actStats
}

// Watch scrapes every activator every period until ctx ends and returns
// when requests were first held, a pod first seen ready and the first held
// request forwarded; it keeps the peak of held requests for heldNow. A
// fact's time is when the scrape that showed it was answered, so it is late
// by up to a period plus a scrape (a few ms).
func (a *activators) Watch(ctx context.Context, period time.Duration, started chan<- struct{}) (*actTimeline, error) {
	addrs, err := a.addrs(ctx)
	if err != nil {
		return nil, err
	}
	tl := &actTimeline{}
	if tl.before, err = a.scrape(ctx, addrs); err != nil {
		return nil, err
	}
	close(started)
	base := sum(tl.before)
	tl.after = tl.before
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return tl, nil
		case <-tick.C:
		}
		byPod, err := a.scrape(ctx, addrs)
		now := time.Now()
		if ctx.Err() != nil {
			return tl, nil
		}
		if err != nil {
			continue // a missed scrape only blurs the times
		}
		tl.after = byPod
		st := sum(byPod)
		a.mu.Lock()
		a.peak = max(a.peak, st.Held)
		a.mu.Unlock()
		first := func(t *time.Time, cond bool) {
			if cond && t.IsZero() {
				*t = now
			}
		}
		first(&tl.held, st.Held > 0)
		first(&tl.podReady, st.ReadyPods > 0)
		first(&tl.forwarded, st.Forwarded > base.Forwarded)
	}
}

// coldStarts are each activator's cold starts during the timeline
// (histogram deltas), e.g. "127ms (sockscale-activator-6d9-abc)".
func (tl *actTimeline) coldStarts() []string {
	var out []string
	for pod, after := range tl.after {
		b := tl.before[pod]
		n := after.ColdStartCount - b.ColdStartCount
		if n <= 0 {
			continue
		}
		avg := time.Duration((after.ColdStartSum - b.ColdStartSum) / n * float64(time.Second))
		s := fmt.Sprintf("%s on %s", ms(avg), pod)
		if n > 1 {
			s = fmt.Sprintf("%s on average of %.0f on %s", ms(avg), n, pod)
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}
