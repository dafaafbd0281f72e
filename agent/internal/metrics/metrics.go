package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockscale/sockscale/agent/internal/podwatch"
	"github.com/sockscale/sockscale/agent/internal/sampler"
	"github.com/sockscale/sockscale/bpf"
)

var podLabels = []string{"namespace", "pod", "workload"}

func desc(name, help string, extra ...string) *prometheus.Desc {
	return prometheus.NewDesc("sockscale_agent_"+name, help, append(append([]string{}, podLabels...), extra...), nil)
}

// Per-pod series, read from the latest sample at each scrape.
var (
	requestsInFlight    = desc("requests_in_flight", "HTTP requests in flight in the pod (proxied ones included).")
	requestsTotal       = desc("requests_total", "HTTP requests the pod completed.")
	concurrencySeconds  = desc("request_concurrency_seconds_total", "Time integral of requests in flight, in seconds; its rate() is the average concurrency.")
	proxiedInFlight     = desc("proxied_requests_in_flight", "Requests in flight that came through an activator.")
	proxiedTotal        = desc("proxied_requests_total", "Completed requests that came through an activator.")
	proxiedConcurrency  = desc("proxied_request_concurrency_seconds_total", "Time integral of proxied requests in flight, in seconds.")
	connsInFlight       = desc("connections_in_flight", "Open server-side TCP connections of the pod.")
	connsTotal          = desc("connections_total", "TCP connections the pod accepted.")
	opaqueInFlight      = desc("opaque_connections_in_flight", "Open connections accounted per connection because they are not HTTP/1.x (TLS, h2, ...).")
	opaqueTotal         = desc("opaque_connections_total", "Connections that fell back to per-connection accounting.")
	probesTotal         = desc("probes_total", "Health-probe requests (kubelet, sockscale) not counted as load.")
	accountingMode      = desc("accounting_mode", "1 for the pod's accounting mode in the last period: mode=\"http\" (per request), \"http2\" (per request, some connections HTTP/2 with each stream a request) or \"connection\" (some connections were neither HTTP/1.x nor HTTP/2).", "mode")
	kernelEventsTotal   = prometheus.NewDesc("sockscale_agent_kernel_events_total", "What the kernel side could not account exactly, or took up late, by event: conn_untracked, parse_limit, parse_error, stream_gap (client bytes never seen), resync (a lost stream found again), adopted (a connection open before the programs, taken up at its next request), h2_full (an HTTP/2 stream beyond the 128 followed on its connection, not counted), h2_lost (HTTP/2 frames not followed: the connection counted as one request from then on), rx_wait (a client segment waited while another CPU walked its connection's bytes: not a loss), rx_takeover (it waited far longer than a walk takes and walked all the same: a claim nobody gave back).", []string{"event"}, nil)
	trackedPods         = prometheus.NewDesc("sockscale_agent_tracked_pods", "Pods whose requests this agent accounts.", nil, nil)
	podMapCapacity      = prometheus.NewDesc("sockscale_agent_pod_map_capacity", "Pods the kernel map can hold.", nil, nil)
	skippedPods         = prometheus.NewDesc("sockscale_agent_skipped_pods", "Pods on this node not accounted, by reason: host_network.", []string{"reason"}, nil)
	podwatchErrors      = prometheus.NewDesc("sockscale_agent_pod_map_errors_total", "Failed updates of the kernel pod map.", nil, nil)
	podwatchPending     = prometheus.NewDesc("sockscale_agent_pod_map_pending", "Pod addresses whose kernel update failed and waits for the next resync (every 10 s).", nil, nil)
	lastSampleTimestamp = prometheus.NewDesc("sockscale_agent_last_sample_timestamp_seconds", "When the kernel counters were last read (Unix time).", nil, nil)
)

// Agent holds the agent's metrics and implements sampler.Recorder.
type Agent struct {
	snapshotSeconds prometheus.Histogram
	errors          *prometheus.CounterVec
	reports         *prometheus.CounterVec
}

// New registers with reg the agent's metrics that the sampler and the
// reporter record (the Recorder); RegisterSamples adds the per-pod series.
func New(reg prometheus.Registerer) *Agent {
	a := &Agent{
		snapshotSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sockscale_agent_snapshot_duration_seconds",
			Help:    "Time to read every pod's counters from the kernel.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 12), // 50us .. 100ms
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_agent_errors_total",
			Help: "Errors of the agent, by stage: snapshot, events, report, token (the ServiceAccount token file for the controller is unreadable), buckets (a controller named its buckets unreadably: it gets every record), node_addresses (the node's own addresses could not be read or set in the kernel: probes from them count as load until they are), audit (a check of a pod's connections against the socket table failed), drain_listen (the preStop wait could not listen, retried every 10 s: leaving pods are not held), legacy_ipv6 (a post to a controller replica that predates stats version 4 left out the IPv6-only pods' records, which it cannot read).",
		}, []string{"stage"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_agent_reports_total",
			Help: "Stats batches sent to controller replicas, by result: ok, error, refused (the controller answered 401 or 403: see the agent's log).",
		}, []string{"result"}),
	}
	reg.MustRegister(a.snapshotSeconds, a.errors, a.reports)
	return a
}

// RegisterSamples registers with reg the series read from the samples at
// each scrape: latest returns the newest sample (nil before the first)
// and status the pod watcher's state.
func RegisterSamples(reg prometheus.Registerer, latest func() *sampler.Sample, status func() podwatch.Status) {
	reg.MustRegister(&collector{latest: latest, status: status})
}

// ObserveSnapshot records how long a kernel read took.
func (a *Agent) ObserveSnapshot(d time.Duration) { a.snapshotSeconds.Observe(d.Seconds()) }

// Error counts an error at stage.
func (a *Agent) Error(stage string) { a.errors.WithLabelValues(stage).Inc() }

// Report counts a batch sent (ok) or not.
func (a *Agent) Report(ok bool) {
	if ok {
		a.reports.WithLabelValues("ok").Inc()
	} else {
		a.reports.WithLabelValues("error").Inc()
	}
}

// Refused counts a batch the controller refused (401 or 403).
func (a *Agent) Refused() { a.reports.WithLabelValues("refused").Inc() }

// collector turns the latest sample into series at scrape time, so a scrape
// costs no kernel read.
type collector struct {
	latest func() *sampler.Sample
	status func() podwatch.Status
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{requestsInFlight, requestsTotal, concurrencySeconds, proxiedInFlight, proxiedTotal,
		proxiedConcurrency, connsInFlight, connsTotal, opaqueInFlight, opaqueTotal, probesTotal, accountingMode,
		kernelEventsTotal, trackedPods, podMapCapacity, skippedPods, podwatchErrors, podwatchPending, lastSampleTimestamp} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.status()
	ch <- prometheus.MustNewConstMetric(trackedPods, prometheus.GaugeValue, float64(st.Tracked))
	ch <- prometheus.MustNewConstMetric(podMapCapacity, prometheus.GaugeValue, bpf.MaxPods)
	ch <- prometheus.MustNewConstMetric(podwatchErrors, prometheus.CounterValue, float64(st.Errors))
	ch <- prometheus.MustNewConstMetric(podwatchPending, prometheus.GaugeValue, float64(st.Pending))
	for _, reason := range []string{podwatch.SkipHostNetwork} {
		ch <- prometheus.MustNewConstMetric(skippedPods, prometheus.GaugeValue, float64(st.Skipped[reason]), reason)
	}
	s := c.latest()
	if s == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(lastSampleTimestamp, prometheus.GaugeValue, float64(s.Time.UnixNano())/1e9)
	ch <- prometheus.MustNewConstMetric(kernelEventsTotal, prometheus.CounterValue, float64(s.Events.ConnUntracked), "conn_untracked")
	ch <- prometheus.MustNewConstMetric(kernelEventsTotal, prometheus.CounterValue, float64(s.Events.ParseLimit), "parse_limit")
	ch <- prometheus.MustNewConstMetric(kernelEventsTotal, prometheus.CounterValue, float64(s.Events.ParseError), "parse_error")
	ch <- prometheus.MustNewConstMetric(kernelEventsTotal, prometheus.CounterValue, float64(s.Events.StreamGap), "stream_gap")
	ch <- prometheus.MustNewConstMetric(kernelEventsTotal, prometheus.CounterValue, float64(s.Events.Resync), "resync")
	ch <- prometheus.MustNewConstMetric(kernelEventsTotal, prometheus.CounterValue, float64(s.Events.Adopted), "adopted")
	ch <- prometheus.MustNewConstMetric(kernelEventsTotal, prometheus.CounterValue, float64(s.Events.H2Full), "h2_full")
	ch <- prometheus.MustNewConstMetric(kernelEventsTotal, prometheus.CounterValue, float64(s.Events.H2Lost), "h2_lost")
	ch <- prometheus.MustNewConstMetric(kernelEventsTotal, prometheus.CounterValue, float64(s.Events.RxWait), "rx_wait")
	ch <- prometheus.MustNewConstMetric(kernelEventsTotal, prometheus.CounterValue, float64(s.Events.RxTakeover), "rx_takeover")
	for _, p := range s.Pods {
		if p.Pod.Name == "" {
			continue // not (yet) known to the watcher: no labels to give it
		}
		l := []string{p.Pod.Namespace, p.Pod.Name, p.Pod.Workload}
		k := p.Counters
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
		}
		counter := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
		}
		gauge(requestsInFlight, float64(k.Requests.InFlight))
		counter(requestsTotal, float64(k.Requests.Completed))
		counter(concurrencySeconds, k.Requests.Area.Seconds())
		gauge(proxiedInFlight, float64(k.Proxied.InFlight))
		counter(proxiedTotal, float64(k.Proxied.Completed))
		counter(proxiedConcurrency, k.Proxied.Area.Seconds())
		gauge(connsInFlight, float64(k.ConnsInFlight))
		counter(connsTotal, float64(k.ConnsTotal))
		gauge(opaqueInFlight, float64(k.OpaqueConnsInFlight))
		counter(opaqueTotal, float64(k.OpaqueConnsTotal))
		counter(probesTotal, float64(k.ProbesTotal))
		for _, mode := range []string{sampler.ModeHTTP, sampler.ModeHTTP2, sampler.ModeConnection} {
			v := 0.0
			if p.Mode == mode {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(accountingMode, prometheus.GaugeValue, v, append(l, mode)...)
		}
	}
}
