package stack

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Ports of the activator's and the agent's pods (the chart's defaults).
const (
	ActivatorProxyPort   = 8012
	ActivatorMetricsPort = 9090
	AgentMetricsPort     = 9090
)

// ActivatorPod is one activator pod as the API shows it.
type ActivatorPod struct {
	Name string
	// IP is the pod's address; invalid before it has one. IPs are all
	// its addresses (one per family on a dual-stack cluster).
	IP  netip.Addr
	IPs []netip.Addr
	// Ready is its Ready condition; Deleting is set once it is being
	// deleted.
	Ready, Deleting bool
}

// Activators lists the activator pods.
func (s *Stack) Activators(ctx context.Context) ([]ActivatorPod, error) {
	var pods corev1.PodList
	if err := s.Client.List(ctx, &pods, client.InNamespace(Namespace), client.MatchingLabels{"app.kubernetes.io/component": "activator"}); err != nil {
		return nil, err
	}
	out := make([]ActivatorPod, 0, len(pods.Items))
	for _, p := range pods.Items {
		a := ActivatorPod{Name: p.Name, Deleting: p.DeletionTimestamp != nil}
		if ip, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			a.IP = ip
		}
		for _, pip := range p.Status.PodIPs {
			if ip, err := netip.ParseAddr(pip.IP); err == nil {
				a.IPs = append(a.IPs, ip)
			}
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady {
				a.Ready = c.Status == corev1.ConditionTrue
			}
		}
		out = append(out, a)
	}
	return out, nil
}

// Sample is one series of a scrape: its labels and value (a counter's or
// a gauge's).
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Scrape reads the Prometheus text at http://ip:port/metrics (an endpoint
// with --metrics-secure=false) and returns the counters' and gauges'
// series by metric name. The chart's agents and activators serve HTTPS:
// Stack.Scrape reads them.
func Scrape(ctx context.Context, ip netip.Addr, port uint16) (map[string][]Sample, error) {
	return scrape(ctx, http.DefaultClient, "http://"+netip.AddrPortFrom(ip, port).String()+"/metrics", "")
}

// scrape GETs url, with token as a bearer token unless empty, and parses
// the Prometheus text: the counters' and gauges' series by metric name.
func scrape(ctx context.Context, hc *http.Client, url, token string) (map[string][]Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("scrape %s: %w: %s", url, &StatusError{Code: resp.StatusCode}, strings.TrimSpace(string(body)))
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", url, err)
	}
	out := make(map[string][]Sample, len(families))
	for name, f := range families {
		for _, m := range f.GetMetric() {
			smp := Sample{Labels: map[string]string{}}
			for _, l := range m.GetLabel() {
				smp.Labels[l.GetName()] = l.GetValue()
			}
			switch {
			case m.Counter != nil:
				smp.Value = m.GetCounter().GetValue()
			case m.Gauge != nil:
				smp.Value = m.GetGauge().GetValue()
			default:
				continue
			}
			out[name] = append(out[name], smp)
		}
	}
	return out, nil
}

// StatusError is a scrape answered with another status than 200.
type StatusError struct{ Code int }

func (e *StatusError) Error() string { return fmt.Sprintf("HTTP %d", e.Code) }

// Sum adds the values of the series of name whose labels include match.
func Sum(scrape map[string][]Sample, name string, match map[string]string) float64 {
	var sum float64
	for _, smp := range scrape[name] {
		ok := true
		for k, v := range match {
			if smp.Labels[k] != v {
				ok = false
				break
			}
		}
		if ok {
			sum += smp.Value
		}
	}
	return sum
}
