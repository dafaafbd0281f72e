package holdpool

import "github.com/prometheus/client_golang/prometheus"

// metrics are the pool's series. No namespace label: a label per tenant
// namespace would grow without bound; the throttle's per-target series
// (sockscale_activator_requests_in_flight) say who holds what.
type metrics struct {
	held     prometheus.Gauge
	refusals *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, capacity int) *metrics {
	m := &metrics{
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sockscale_activator_held_requests",
			Help: "Requests held (waiting for a pod slot) for all targets together, which --max-held bounds.",
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_activator_hold_pool_refusals_total",
			Help: "Requests the held-request pool turned away, by reason: full (the activator held --max-held requests and the request's namespace its fair share: refused), shed (held, then dropped to make room for a namespace holding less than its fair share).",
		}, []string{"reason"}),
	}
	capGauge := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "sockscale_activator_max_held_requests",
		Help: "The most requests the activator holds at once (--max-held, or what it derived from its memory limit).",
	})
	capGauge.Set(float64(capacity))
	// Both reasons from the start, so a rate over them is 0, not absent.
	m.refusals.WithLabelValues(ReasonFull)
	m.refusals.WithLabelValues(ReasonShed)
	if reg != nil {
		reg.MustRegister(m.held, m.refusals, capGauge)
	}
	return m
}
