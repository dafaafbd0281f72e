package kpa

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the controller's per-target series, labelled namespace and
// podautoscaler. Register them with controller-runtime's registry
// (sigs.k8s.io/controller-runtime/pkg/metrics.Registry) in main.
type Metrics struct {
	desired, stable, panicValue, ebc, panicking, missing *prometheus.GaugeVec
	decisions                                            prometheus.Counter
	latency, interval, poke                              prometheus.Histogram
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	labels := []string{"namespace", "podautoscaler"}
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sockscale_controller_" + name, Help: help}, labels)
	}
	m := &Metrics{
		desired:    gauge("desired_pods", "Pods the autoscaler wants for the target (after bounds)."),
		stable:     gauge("stable_value", "The target's metric averaged over the stable window."),
		panicValue: gauge("panic_value", "The target's metric averaged over the panic window."),
		ebc:        gauge("excess_burst_capacity", "Excess burst capacity; negative keeps the activator in the path."),
		panicking:  gauge("panic_mode", "1 while the target is in panic mode, else 0."),
		missing: gauge("missing_stats_pods", "Ready pods of the target whose stats have not arrived for 2 s or more (their node's agent is not reporting): "+
			"their load is estimated from the pods heard, or the decision holds when too few were heard."),
		decisions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sockscale_controller_decisions_total", Help: "Autoscaling decisions made (every target every tick).",
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sockscale_controller_decision_duration_seconds",
			Help:    "Time to reconcile one PodAutoscaler tick: read, decide, scale, write status.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 16), // 100us .. 3.3s
		}),
		interval: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sockscale_controller_decision_interval_seconds",
			Help: "Time between two decisions of the same target (every 2 s when the controller keeps up; longer when its workers fall behind, shorter after a poke or a change).",
			// Fine around the 2 s tick, whose goal is a p99 within 2.2 s.
			Buckets: []float64{0.5, 1, 1.5, 1.9, 2, 2.05, 2.1, 2.2, 2.5, 3, 4, 5, 7.5, 10, 15, 30, 60},
		}),
		poke: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sockscale_controller_poke_duration_seconds",
			Help: "Time from load reaching a target whose last decision was zero pods (an activator's poke, or an agent's batch) to the end of the decision it woke, " +
				"its /scale write included: the controller's part of a cold start (goal p99 <= 50 ms). A target that cannot be decided (no Deployment, invalid settings) is not counted.",
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5},
		}),
	}
	reg.MustRegister(m.desired, m.stable, m.panicValue, m.ebc, m.panicking, m.missing, m.decisions, m.latency, m.interval, m.poke)
	return m
}

// record takes a decision: its outcome, how long it took, and the time
// since the target's previous decision (0: its first).
func (m *Metrics) record(ns, name string, desired int32, stable, panicValue float64, ebc int32, panicking bool, missing int, seconds, sincePrevious float64) {
	if m == nil {
		return
	}
	m.missing.WithLabelValues(ns, name).Set(float64(missing))
	m.desired.WithLabelValues(ns, name).Set(float64(desired))
	m.stable.WithLabelValues(ns, name).Set(stable)
	m.panicValue.WithLabelValues(ns, name).Set(panicValue)
	m.ebc.WithLabelValues(ns, name).Set(float64(ebc))
	p := 0.0
	if panicking {
		p = 1
	}
	m.panicking.WithLabelValues(ns, name).Set(p)
	m.decisions.Inc()
	m.latency.Observe(seconds)
	if sincePrevious > 0 {
		m.interval.Observe(sincePrevious)
	}
}

// poked takes the time from a poke to the end of the decision it woke.
func (m *Metrics) poked(d time.Duration) {
	if m == nil {
		return
	}
	m.poke.Observe(d.Seconds())
}

func (m *Metrics) forget(ns, name string) {
	if m == nil {
		return
	}
	for _, v := range []*prometheus.GaugeVec{m.desired, m.stable, m.panicValue, m.ebc, m.panicking, m.missing} {
		v.DeleteLabelValues(ns, name)
	}
}
