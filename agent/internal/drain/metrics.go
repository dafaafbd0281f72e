package drain

import "github.com/prometheus/client_golang/prometheus"

// Results of a pod's drain, the label values of drains_total.
const (
	resultDrained = "drained"
	resultGone    = "gone"
)

type metrics struct {
	started    prometheus.Counter
	draining   prometheus.Gauge
	drains     *prometheus.CounterVec
	took       prometheus.Histogram
	handed     prometheus.Counter
	idleClosed prometheus.Counter
	cut        prometheus.Counter
	errors     prometheus.Counter
	// waitTimeouts counts preStop waits that ended before their pods
	// were drained.
	waitTimeouts prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		started: prometheus.NewCounter(prometheus.CounterOpts{Name: "sockscale_agent_drains_started_total",
			Help: "Leaving pods whose drain began (their deletion seen)."}),
		draining: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sockscale_agent_drains_in_progress",
			Help: "Leaving pods being drained now: deleted, not drained yet, still there."}),
		drains: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sockscale_agent_drains_total",
			Help: "Leaving pods whose drain ended, by result: drained (nothing in flight, its preStop hook may let the app stop), gone (deleted first: its grace period ran out, or it had no hook that waited)."}, []string{"result"}),
		took: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sockscale_agent_drain_duration_seconds",
			Help:    "Time from a pod's deletion to its being drained.",
			Buckets: []float64{1, 2, 3, 5, 10, 20, 30, 60, 120, 300}}),
		handed: prometheus.NewCounter(prometheus.CounterOpts{Name: "sockscale_agent_drain_connections_handed_total",
			Help: "Connections of leaving pods handed to the kernel's drain program: their next response asks the client to close them."}),
		idleClosed: prometheus.NewCounter(prometheus.CounterOpts{Name: "sockscale_agent_drain_idle_closed_total",
			Help: "Idle connections of leaving pods whose server side the agent closed."}),
		cut: prometheus.NewCounter(prometheus.CounterOpts{Name: "sockscale_agent_drain_requests_cut_total",
			Help: "Requests still in flight on a pod that was deleted before it was drained."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "sockscale_agent_drain_errors_total",
			Help: "Failures to read or act on a leaving pod's connections."}),
		waitTimeouts: prometheus.NewCounter(prometheus.CounterOpts{Name: "sockscale_agent_drain_wait_timeouts_total",
			Help: "preStop waits (GET /drain) that ended before their pods were drained: their timeout passed, or the kubelet gave up."}),
	}
	if reg != nil {
		reg.MustRegister(m.started, m.draining, m.drains, m.took, m.handed, m.idleClosed, m.cut, m.errors, m.waitTimeouts)
	}
	return m
}
