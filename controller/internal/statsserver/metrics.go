package statsserver

import (
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/sockscale/sockscale/internal/stats"
)

// Metrics counts what the stats handler took and refused.
type Metrics struct {
	refusedTotal  *prometheus.CounterVec
	rejectedTotal *prometheus.CounterVec
	// podRecords and targetRecords count the records handed to the
	// collector: agents' and activators'.
	podRecords, targetRecords prometheus.Counter
}

// NewMetrics registers the handler's counters with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		refusedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_controller_stats_requests_refused_total",
			Help: "Stats requests refused whole, by reason: too_many_in_flight, no_token, invalid_token, review_failed (503), " +
				"forbidden (RBAC), mixed_batch, wrong_kind, unbound_token, wrong_node, wrong_sender (the batch is not the caller's to send).",
		}, []string{"reason"}),
		rejectedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_controller_stats_records_rejected_total",
			Help: "Pod records dropped from agents' batches, by reason: unknown_pod (not an endpoint of its target), wrong_node (a pod of another node).",
		}, []string{"reason"}),
	}
	records := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sockscale_controller_stats_records_total",
		Help: "Records of accepted batches taken into the windows, by kind: pod (agents'), target (activators'). With --buckets, agents send a replica only its buckets' pod records.",
	}, []string{"kind"})
	m.podRecords, m.targetRecords = records.WithLabelValues("pod"), records.WithLabelValues("target")
	reg.MustRegister(m.refusedTotal, m.rejectedTotal, records)
	return m
}

func (m *Metrics) took(b *stats.Batch) {
	if m != nil {
		m.podRecords.Add(float64(len(b.Pods)))
		m.targetRecords.Add(float64(len(b.Targets)))
	}
}

func (m *Metrics) refused(reason string) {
	if m != nil {
		m.refusedTotal.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) rejected(reason string) {
	if m != nil {
		m.rejectedTotal.WithLabelValues(reason).Inc()
	}
}

// logInterval is how often one reason is logged at most: a forger or a
// misconfigured sender posts every second, and one line per reason says
// enough.
const logInterval = 10 * time.Second

// RateLimitedLog logs at most one line per reason every logInterval,
// with how many it left out since.
type RateLimitedLog struct {
	log   logr.Logger
	clock clock.PassiveClock
	mu    sync.Mutex
	last  map[string]*logged
}

type logged struct {
	at         time.Time
	suppressed int
}

// NewRateLimitedLog logs to log with clk's time.
func NewRateLimitedLog(log logr.Logger, clk clock.PassiveClock) *RateLimitedLog {
	return &RateLimitedLog{log: log, clock: clk, last: make(map[string]*logged)}
}

// Print logs msg unless reason was logged within logInterval.
func (l *RateLimitedLog) Print(reason, msg string) {
	if l == nil {
		return
	}
	now := l.clock.Now()
	l.mu.Lock()
	e := l.last[reason]
	if e != nil && now.Sub(e.at) < logInterval {
		e.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := 0
	if e != nil {
		suppressed = e.suppressed
	}
	l.last[reason] = &logged{at: now}
	l.mu.Unlock()
	l.log.Info("refused stats", "reason", reason, "message", msg, "suppressedSinceLast", suppressed)
}
