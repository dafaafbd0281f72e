package stats

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockscale/sockscale/activator/internal/target"
	wire "github.com/sockscale/sockscale/internal/stats"
)

// Sender posts batches to every controller replica (internal/stats/report).
type Sender interface {
	// Offer queues a period's batch without blocking; a newer one
	// replaces it if it has not gone yet.
	Offer(b *wire.Batch)
	// Send posts b now and waits for the replicas' answers.
	Send(ctx context.Context, b *wire.Batch)
}

// pokePeriod is the length a poke's batch claims: the controller records
// it in the second it ends in, which is the moment of the poke.
const pokePeriod = time.Millisecond

// Wire is the Reporter that sends to the controller in the stats wire
// format (version 2 target records). Targets are keyed by their public
// Service here and by their Deployment in the controller's windows;
// Workload maps one to the other, and a target it does not know (removed
// meanwhile) is left out.
//
// A poke is sent at once, on its own goroutine, as a record of the
// target's in-flight count over the last millisecond: the controller
// records it like any report and decides the target immediately. The
// period report that covers the same second adds its average on top, so
// that one second counts the held requests about twice: with the default
// 60 s stable window, 1 held request adds ~1/60 to the stable average for
// a minute (the panic window, 6 s, ~1/6), which cannot change a decision
// from zero upward by more than the request already does.
type Wire struct {
	// Self names this activator in its batches (its pod name).
	Self     string
	Workload func(target.Key) (string, bool)
	Sender   Sender
	// Context bounds pokes' sends (the process's lifetime).
	Context context.Context
	Log     *slog.Logger
}

// The controller's stats endpoint asks the API server whether the
// activator may "create" targetstats.sockscale.dev (a virtual resource):
// that permission is what lets it report targets.
// +kubebuilder:rbac:groups=sockscale.dev,resources=targetstats,verbs=create

// Report queues one period's records for the controller.
func (w *Wire) Report(start time.Time, period time.Duration, records []Record) {
	b := &wire.Batch{Node: w.Self, Start: start, Period: period}
	for _, r := range records {
		workload, ok := w.Workload(r.Key)
		if !ok {
			continue
		}
		b.Targets = append(b.Targets, wire.TargetStat{Namespace: r.Key.Namespace, Workload: workload,
			Concurrency: r.Concurrency, Requests: r.Requests})
	}
	if len(b.Targets) > 0 {
		w.Sender.Offer(b)
	}
}

// Poke sends the target's held load to the controller now.
func (w *Wire) Poke(key target.Key, at time.Time, inFlight int) {
	workload, ok := w.Workload(key)
	if !ok {
		w.Log.Warn("poke for a target with no known Deployment; it waits for the next report", "target", key.String())
		return
	}
	b := &wire.Batch{Node: w.Self, Start: at.Add(-pokePeriod), Period: pokePeriod,
		Targets: []wire.TargetStat{{Namespace: key.Namespace, Workload: workload, Concurrency: float64(inFlight)}}}
	go w.Sender.Send(w.Context, b)
}

// ReportMetrics counts the batches sent to controller replicas (the
// transport's Recorder).
type ReportMetrics struct {
	reports *prometheus.CounterVec
	errors  *prometheus.CounterVec
}

// NewReportMetrics registers the transport's counters with reg.
func NewReportMetrics(reg prometheus.Registerer) *ReportMetrics {
	m := &ReportMetrics{
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_activator_reports_total",
			Help: "Stats batches posted to controller replicas, by result: ok, failed or refused (401 or 403: see the log) (per replica).",
		}, []string{"result"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_activator_report_errors_total",
			Help: "Stats batches that could not be built, by stage: report, token (the ServiceAccount token file is unreadable).",
		}, []string{"stage"}),
	}
	reg.MustRegister(m.reports, m.errors)
	return m
}

// Report counts one post to one replica.
func (m *ReportMetrics) Report(ok bool) {
	if ok {
		m.reports.WithLabelValues("ok").Inc()
	} else {
		m.reports.WithLabelValues("failed").Inc()
	}
}

// Refused counts a post a replica refused (401 or 403).
func (m *ReportMetrics) Refused() { m.reports.WithLabelValues("refused").Inc() }

// Error counts a batch that failed before it was sent.
func (m *ReportMetrics) Error(stage string) { m.errors.WithLabelValues(stage).Inc() }
