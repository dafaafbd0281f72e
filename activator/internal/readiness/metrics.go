package readiness

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockscale/sockscale/activator/internal/target"
)

// Probe results, the values of the result label.
const (
	resultReady    = "ready"
	resultNotReady = "not_ready"
	resultError    = "error"
)

type metrics struct {
	probes      *prometheus.CounterVec
	probedReady *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_activator_probes_total",
			Help: "Readiness probes sent to pods, by result: ready (an answer below 500), not_ready (5xx), error (no answer in time).",
		}, []string{"result"}),
		probedReady: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_activator_pods_probed_ready_total",
			Help: "Pods found ready by this activator's probe before their EndpointSlice said so.",
		}, []string{"namespace", "name"}),
	}
	for _, r := range []string{resultReady, resultNotReady, resultError} {
		m.probes.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.probes, m.probedReady)
	}
	return m
}

func (m *metrics) forget(k target.Key) {
	m.probedReady.DeletePartialMatch(prometheus.Labels{"namespace": k.Namespace, "name": k.Name})
}
