package redirect

import (
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sockscale/sockscale/internal/stats"
)

// Label values of the metrics.
const (
	opSet    = "set"
	opDelete = "delete"

	resultOK    = "ok"
	resultError = "error"

	stageEntries  = "read_entries"
	stageCounters = "read_counters"
	stageEvents   = "read_events"
	stageForget   = "forget"
	stageLease    = "renew_lease"
)

var (
	connectsDesc = prometheus.NewDesc("sockscale_agent_redirect_connects_total",
		"Connects on this node that the kernel sent to an activator instead of the public Service's address, by ServerlessService and port of the Service.",
		[]string{"namespace", "serverlessservice", "port"}, nil)
	kernelEventsDesc = prometheus.NewDesc("sockscale_agent_redirect_kernel_events_total",
		"Unusual paths of the redirect programs, by event: entry_refused (an unusable entry, the connect left alone), no_origin (redirected, but getpeername shows the activator), counter_lost (redirected, not counted), lease_expired (an entry ignored: the agent's lease on the map had lapsed, the connect left alone).",
		[]string{"event"}, nil)
)

// RedirectStates are the values of the state label, in the order of
// stats.RedirectState's documentation.
var RedirectStates = []stats.RedirectState{stats.RedirectActive, stats.RedirectSyncing, stats.RedirectOff, stats.RedirectUnavailable}

var stateDesc = prometheus.NewDesc("sockscale_agent_socket_redirect_state",
	"How the socket-layer redirect stands on this node: 1 for the current state, 0 for the others, by state: active, syncing, off, unavailable. The agent sends the same state, with its reason, to the controller.",
	[]string{"state"}, nil)

// RegisterStateMetric registers the state gauge, read from state at
// scrape time. It is the agent's, not the Reconciler's: the state is also
// known when no Reconciler runs (off, or the kernel cannot load it).
func RegisterStateMetric(reg prometheus.Registerer, state func() stats.NodeState) {
	reg.MustRegister(stateCollector(state))
}

type stateCollector func() stats.NodeState

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- stateDesc }

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	now := c().SocketRedirect
	for _, s := range RedirectStates {
		v := 0.0
		if s == now {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(stateDesc, prometheus.GaugeValue, v, string(s))
	}
}

type metrics struct {
	entries prometheus.Gauge
	updates *prometheus.CounterVec
	latency prometheus.Histogram
	errors  *prometheus.CounterVec
	skipped *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer, r *Reconciler) *metrics {
	m := &metrics{
		entries: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sockscale_agent_redirect_entries",
			Help: "Service addresses (cluster IP and port) the kernel redirects to activators on this node.",
		}),
		updates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_agent_redirect_updates_total",
			Help: "Writes to the kernel redirect map, by op (set, delete) and result (ok, error).",
		}, []string{"op", "result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sockscale_agent_redirect_update_latency_seconds",
			Help: "From a ServerlessService status change seen by the agent to the kernel map written for it.",
			// 100us .. ~3.3s: a write takes microseconds, a busy sync more.
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 16),
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_agent_redirect_errors_total",
			Help: "Errors of the redirect besides writes, by stage: read_entries, read_counters, read_events, forget, renew_lease.",
		}, []string{"stage"}),
		skipped: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sockscale_agent_redirect_skipped_targets",
			Help: "ServerlessServices in Proxy mode the kernel does not redirect (kube-proxy's path only), by reason: " + joinReasons() + ".",
		}, []string{"reason"}),
	}
	for _, op := range []string{opSet, opDelete} {
		for _, res := range []string{resultOK, resultError} {
			m.updates.WithLabelValues(op, res)
		}
	}
	for _, s := range []string{stageEntries, stageCounters, stageEvents, stageForget, stageLease} {
		m.errors.WithLabelValues(s)
	}
	m.setSkipped(nil)
	reg.MustRegister(m.entries, m.updates, m.latency, m.errors, m.skipped, &collector{r: r})
	return m
}

func joinReasons() string { return strings.Join(SkipReasons, ", ") }

func (m *metrics) setSkipped(skipped map[types.NamespacedName]string) {
	n := make(map[string]int)
	for _, reason := range skipped {
		n[reason]++
	}
	for _, reason := range SkipReasons {
		m.skipped.WithLabelValues(reason).Set(float64(n[reason]))
	}
}

// collector reads the kernel's counters at scrape time: a scrape costs one
// walk of the counter map, and nothing runs between scrapes.
type collector struct{ r *Reconciler }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- connectsDesc
	ch <- kernelEventsDesc
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	counts, targets, err := c.r.counters()
	if err != nil {
		c.r.metrics.errors.WithLabelValues(stageCounters).Inc()
	}
	type series struct {
		target types.NamespacedName
		port   uint16
	}
	// Summed per series: a Service has one IPv4 cluster IP today, but two
	// addresses with the same labels must not make the scrape fail.
	sums := make(map[series]uint64)
	for a, n := range counts {
		t, ok := targets[a]
		if !ok {
			continue // no ServerlessService's any more: forgotten at the next resync
		}
		sums[series{t, a.Port()}] += n
	}
	for s, n := range sums {
		ch <- prometheus.MustNewConstMetric(connectsDesc, prometheus.CounterValue, float64(n), s.target.Namespace, s.target.Name, strconv.Itoa(int(s.port)))
	}
	ev, err := c.r.opts.Map.Events()
	if err != nil {
		c.r.metrics.errors.WithLabelValues(stageEvents).Inc()
		return
	}
	ch <- prometheus.MustNewConstMetric(kernelEventsDesc, prometheus.CounterValue, float64(ev.EntryRefused), "entry_refused")
	ch <- prometheus.MustNewConstMetric(kernelEventsDesc, prometheus.CounterValue, float64(ev.NoOrigin), "no_origin")
	ch <- prometheus.MustNewConstMetric(kernelEventsDesc, prometheus.CounterValue, float64(ev.CounterLost), "counter_lost")
	ch <- prometheus.MustNewConstMetric(kernelEventsDesc, prometheus.CounterValue, float64(ev.LeaseExpired), "lease_expired")
}
