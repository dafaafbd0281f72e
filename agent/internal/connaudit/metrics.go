package connaudit

import (
	"github.com/prometheus/client_golang/prometheus"
)

// auditMetrics are the Auditor's metrics; the per-pod gauge is read from
// the latest checks at each scrape.
type auditMetrics struct {
	a           *Auditor
	audits      *prometheus.CounterVec
	corrections *prometheus.CounterVec
	duration    prometheus.Histogram
}

const miscountedHelp = "How far the pod's open-connection count was from the kernel's socket table at its latest check, before the check corrected it: positive for connections counted that were not open, negative for open ones not counted (idle since before the agent or the pod was added)."

var miscountedDesc = prometheus.NewDesc("sockscale_agent_connections_miscounted", miscountedHelp, []string{"namespace", "pod", "workload"}, nil)

func newMetrics(a *Auditor) *auditMetrics {
	return &auditMetrics{
		a: a,
		audits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_agent_connection_audits_total",
			Help: "Checks of a pod's connections against the kernel's socket table, by result: ok, error (see the log), full (some connections could not be learned: the kernel's map of learned connections is full).",
		}, []string{"result"}),
		corrections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_agent_connection_corrections_total",
			Help: "Connections the checks corrected the counts by, by reason: unseen (open, never seen by the programs: learned), gone (learned earlier, closed without a segment the programs saw), drift (counted without a socket, or the reverse, found while nothing moved).",
		}, []string{"reason"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sockscale_agent_connection_audit_duration_seconds",
			Help:    "Time to check every pod of the node against the socket table.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 14), // 100us .. 0.8s
		}),
	}
}

func (m *auditMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.audits.Describe(ch)
	m.corrections.Describe(ch)
	m.duration.Describe(ch)
	ch <- miscountedDesc
}

func (m *auditMetrics) Collect(ch chan<- prometheus.Metric) {
	m.audits.Collect(ch)
	m.corrections.Collect(ch)
	m.duration.Collect(ch)
	// One series per pod: a dual-stack pod's two addresses are checked
	// apart (each has its own counts), and their differences add up.
	type podKey struct{ namespace, name, workload string }
	miscounted := map[podKey]int64{}
	m.a.mu.Lock()
	for ip, r := range m.a.last {
		if pod, ok := m.a.pods.Lookup(ip); ok {
			miscounted[podKey{pod.Namespace, pod.Name, pod.Workload}] += int64(r.Miscounted())
		}
	}
	m.a.mu.Unlock()
	for k, n := range miscounted {
		ch <- prometheus.MustNewConstMetric(miscountedDesc, prometheus.GaugeValue, float64(n), k.namespace, k.name, k.workload)
	}
}
