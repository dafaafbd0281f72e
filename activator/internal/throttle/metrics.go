package throttle

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockscale/sockscale/activator/internal/target"
)

// metrics are the throttle's series, labelled by target (namespace, name).
type metrics struct {
	inFlight  *prometheus.GaugeVec
	results   *prometheus.CounterVec
	wait      *prometheus.HistogramVec
	coldStart *prometheus.HistogramVec
	pods      *prometheus.GaugeVec
}

// Hold results, the values of the result label.
const (
	resultForwarded     = "forwarded"
	resultQueueFull     = "queue_full"
	resultDeadline      = "deadline"
	resultCanceled      = "canceled"
	resultTargetRemoved = "target_removed"
	resultUnreachable   = "pod_unreachable"
)

// waitBuckets span a warm request (no wait) to the longest timeout (600 s).
var waitBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

func newMetrics(reg prometheus.Registerer) *metrics {
	labels := []string{"namespace", "name"}
	m := &metrics{
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sockscale_activator_requests_in_flight",
			Help: "Requests this activator has for a target, by state: held (waiting for a pod slot), forwarded (at a pod).",
		}, append(labels, "state")),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_activator_hold_results_total",
			Help: "Requests that asked for a pod slot, by result: forwarded (each time one is handed a pod's slot, including a request then refused by the target's NetworkPolicies: sockscale_activator_network_policy_denials_total counts those), pod_unreachable (the pod could not be reached and nothing was sent: the request goes to another pod), queue_full (503), deadline (504), canceled (client gone or shutdown), target_removed.",
		}, append(labels, "result")),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sockscale_activator_wait_duration_seconds",
			Help:    "Time from a request's arrival to its pod slot (0 when a slot was free).",
			Buckets: waitBuckets,
		}, labels),
		coldStart: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sockscale_activator_cold_start_duration_seconds",
			Help:    "Time from the first request held while a target had no ready pod to the first held request handed to a pod.",
			Buckets: waitBuckets,
		}, labels),
		pods: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sockscale_activator_pods",
			Help: "A target's ready pods known to this activator, by state: ready (all), assigned (those this activator sends requests to).",
		}, append(labels, "state")),
	}
	if reg != nil {
		reg.MustRegister(m.inFlight, m.results, m.wait, m.coldStart, m.pods)
	}
	return m
}

// targetMetrics are one target's series, looked up once so requests pay
// no label lookups.
type targetMetrics struct {
	held, forwarding                                  prometheus.Gauge
	forwarded, queueFull, deadline, canceled, removed prometheus.Counter
	unreachable                                       prometheus.Counter
	wait, coldStart                                   prometheus.Observer
	readyPods, assignedPods                           prometheus.Gauge
}

func (m *metrics) forTarget(k target.Key) targetMetrics {
	ns, n := k.Namespace, k.Name
	return targetMetrics{
		held:         m.inFlight.WithLabelValues(ns, n, "held"),
		forwarding:   m.inFlight.WithLabelValues(ns, n, "forwarded"),
		forwarded:    m.results.WithLabelValues(ns, n, resultForwarded),
		queueFull:    m.results.WithLabelValues(ns, n, resultQueueFull),
		deadline:     m.results.WithLabelValues(ns, n, resultDeadline),
		canceled:     m.results.WithLabelValues(ns, n, resultCanceled),
		removed:      m.results.WithLabelValues(ns, n, resultTargetRemoved),
		unreachable:  m.results.WithLabelValues(ns, n, resultUnreachable),
		wait:         m.wait.WithLabelValues(ns, n),
		coldStart:    m.coldStart.WithLabelValues(ns, n),
		readyPods:    m.pods.WithLabelValues(ns, n, "ready"),
		assignedPods: m.pods.WithLabelValues(ns, n, "assigned"),
	}
}

// forget drops a deleted target's series.
func (m *metrics) forget(k target.Key) {
	l := prometheus.Labels{"namespace": k.Namespace, "name": k.Name}
	m.inFlight.DeletePartialMatch(l)
	m.results.DeletePartialMatch(l)
	m.wait.DeletePartialMatch(l)
	m.coldStart.DeletePartialMatch(l)
	m.pods.DeletePartialMatch(l)
}
