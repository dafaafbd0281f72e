package redirect

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	bpfredirect "github.com/sockscale/sockscale/bpf/redirect"
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

	// kindStale is the kind label of entries in the map that no target
	// wants any more (a delete that failed, retried).
	kindStale = "stale"
)

var (
	connectsDesc = prometheus.NewDesc("sockscale_agent_redirect_connects_total",
		"Connects on this node that the kernel sent to an activator instead of the public Service's address, by ServerlessService and port of the Service.",
		[]string{"namespace", "serverlessservice", "port"}, nil)
	routeConnectsDesc = prometheus.NewDesc("sockscale_agent_redirect_route_connects_total",
		"Connects on this node that the kernel sent from a Route's address to the public Service of one of its revisions (by the split's weights, or a tag's revision), by namespace, route, tag (empty for the Route's own address) and port of the Route's Service. A connect that goes on to an activator (the revision is in Proxy mode) also counts in sockscale_agent_redirect_connects_total.",
		[]string{"namespace", "route", "tag", "port"}, nil)
	kernelEventsDesc = prometheus.NewDesc("sockscale_agent_redirect_kernel_events_total",
		"Unusual paths of the redirect programs, by event: entry_refused (an unusable entry, the connect left alone), no_origin (redirected, but getpeername shows the activator), counter_lost (redirected, not counted), lease_expired (an entry ignored: the agent's lease on the map had lapsed, the connect left alone).",
		[]string{"event"}, nil)
)

// RedirectStates are the values of the state label, in the order of
// stats.RedirectState's documentation.
var RedirectStates = []stats.RedirectState{stats.RedirectActive, stats.RedirectSyncing, stats.RedirectOff, stats.RedirectUnavailable}

var routesStateDesc = prometheus.NewDesc("sockscale_agent_redirect_routes_state",
	"How the Route entries (traffic splits) stand on this node: 1 for the current state, 0 for the others, by state: active, syncing (starting, or the Routes' watch fails), unavailable (the serving CRDs are missing or Routes are forbidden: no Route address has an entry, the agent retries). ServerlessService entries do not depend on it.",
	[]string{"state"}, nil)

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
	entries *prometheus.GaugeVec
	updates *prometheus.CounterVec
	latency prometheus.Histogram
	errors  *prometheus.CounterVec
	skipped *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer, r *Reconciler) *metrics {
	m := &metrics{
		entries: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sockscale_agent_redirect_entries",
			Help: "Service addresses (cluster IP and port) the kernel redirects on this node, by kind: serverlessservice (a public Service in Proxy mode, to activators), route (a Route's own address, to its revisions by percent), tag (a tag's address, to its revision), stale (no longer wanted, its delete failed and is retried).",
		}, []string{"kind"}),
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
			Help: "Addresses the kernel does not redirect (kube-proxy's path only), by kind and reason. Kind serverlessservice: ServerlessServices in Proxy mode, reason " +
				strings.Join(SkipReasons, ", ") + ". Kinds route and tag: a Route's own and its tags' Services, reason " + strings.Join(RouteSkipReasons, ", ") + ".",
		}, []string{"kind", "reason"}),
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
	m.setEntries(nil, nil)
	reg.MustRegister(m.entries, m.updates, m.latency, m.errors, m.skipped, &collector{r: r})
	return m
}

// skipReasons are the reasons of each kind.
func skipReasons(kind string) []string {
	if kind == KindServerlessService {
		return SkipReasons
	}
	return RouteSkipReasons
}

func (m *metrics) setSkipped(skipped map[Target]string) {
	type series struct{ kind, reason string }
	n := make(map[series]int)
	for t, reason := range skipped {
		n[series{t.Kind, reason}]++
	}
	for _, kind := range Kinds {
		for _, reason := range skipReasons(kind) {
			m.skipped.WithLabelValues(kind, reason).Set(float64(n[series{kind, reason}]))
		}
	}
}

// setEntries counts the entries in the map by the kind of the desired
// entry at their address.
func (m *metrics) setEntries(inMap map[netip.AddrPort][]bpfredirect.Backend, desired map[netip.AddrPort]Entry) {
	n := make(map[string]int)
	for a := range inMap {
		kind := kindStale
		if e, ok := desired[a]; ok {
			kind = e.Target.Kind
		}
		n[kind]++
	}
	for _, kind := range append(slices.Clone(Kinds), kindStale) {
		m.entries.WithLabelValues(kind).Set(float64(n[kind]))
	}
}

// collector reads the kernel's counters at scrape time: a scrape costs one
// walk of the counter map, and nothing runs between scrapes.
type collector struct{ r *Reconciler }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- connectsDesc
	ch <- routeConnectsDesc
	ch <- kernelEventsDesc
	ch <- routesStateDesc
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	counts, targets, err := c.r.counters()
	if err != nil {
		c.r.metrics.errors.WithLabelValues(stageCounters).Inc()
	}
	type series struct {
		target Target
		port   uint16
	}
	// Summed per series: a dual-stack Service's two addresses at one port
	// are one series, and two addresses with the same labels must not make
	// the scrape fail.
	sums := make(map[series]uint64)
	for a, n := range counts {
		t, ok := targets[a]
		if !ok {
			continue // no target's any more: forgotten at the next resync
		}
		sums[series{t, a.Port()}] += n
	}
	for s, n := range sums {
		port := strconv.Itoa(int(s.port))
		if s.target.Kind == KindServerlessService {
			ch <- prometheus.MustNewConstMetric(connectsDesc, prometheus.CounterValue, float64(n), s.target.Namespace, s.target.Name, port)
		} else {
			ch <- prometheus.MustNewConstMetric(routeConnectsDesc, prometheus.CounterValue, float64(n), s.target.Namespace, s.target.Name, s.target.Tag, port)
		}
	}
	routes := c.r.RoutesState().SocketRedirect
	for _, s := range []stats.RedirectState{stats.RedirectActive, stats.RedirectSyncing, stats.RedirectUnavailable} {
		v := 0.0
		if s == routes {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(routesStateDesc, prometheus.GaugeValue, v, string(s))
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
