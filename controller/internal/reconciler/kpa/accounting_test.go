package kpa

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/internal/stats"
)

func TestAccountingOf(t *testing.T) {
	const none, requests, connections = v1alpha1.Accounting(""), v1alpha1.AccountingRequests, v1alpha1.AccountingConnections
	window := func(concurrency, opaque float64) collector.Accounting {
		return collector.Accounting{HasData: true, Concurrency: concurrency, Opaque: opaque}
	}
	tests := []struct {
		name string
		last v1alpha1.Accounting
		a    collector.Accounting
		want v1alpha1.Accounting
	}{
		{"no stats yet", none, collector.Accounting{}, none},
		{"no stats in the window keeps the last value", connections, collector.Accounting{}, connections},
		{"TLS target: every connection opaque", none, window(3, 3), connections},
		{"TLS target at one connection in flight", requests, window(1, 1), connections},
		{"gRPC with one stray connection in the window", none, window(40, 0.0002), requests},
		{"gRPC with one stray connection, shown Connections before", connections, window(40, 0.0002), requests},
		{"mixed 50/50", requests, window(10, 5), connections},
		{"mixed at exactly 10 %", requests, window(10, 1), connections},
		{"mixed just under 10 %", connections, window(10, 0.99), requests},
		{"a busy target with one long-lived opaque connection", none, window(200, 1), requests},
		{"opaque but under 0.1 in flight", none, window(0.05, 0.05), requests},
		{"idle, nothing shown yet", none, window(0, 0), requests},
		{"idle keeps Connections", connections, window(0, 0), connections},
		{"idle keeps Requests", requests, window(0.01, 0), requests},
		{"HTTP/1 at load", none, window(70, 0), requests},
	}
	for _, tt := range tests {
		if got := accountingOf(tt.last, tt.a); got != tt.want {
			t.Errorf("%s: last %q, window %+v: %q, want %q", tt.name, tt.last, tt.a, got, tt.want)
		}
	}
}

// TestAccountingEvent: status.accounting follows the pods' stats, and a
// turn to Connections is announced once, not on every tick.
func TestAccountingEvent(t *testing.T) {
	o := newOwnerRig(t)
	rec := events.NewFakeRecorder(10)
	o.pa.Events = rec
	clk := o.pa.Clock.(*clocktesting.FakeClock)
	pod := netip.MustParseAddr("10.0.0.5")
	// report sends the app's one pod at concurrency, opaque of it on
	// connections counted per connection, for the seconds given.
	report := func(seconds int, concurrency, opaque float64) {
		for range seconds {
			clk.Step(time.Second)
			p := stats.PodStat{IP: pod, Namespace: "default", Pod: "app-0", Workload: "app", Concurrency: concurrency}
			if opaque > 0 {
				p.Accounting, p.OpaqueConcurrency = stats.AccountingConnections, opaque
			}
			o.col.RecordPods(&stats.Batch{Node: "node-a", Start: clk.Now().Add(-time.Second), Period: time.Second, Pods: []stats.PodStat{p}})
		}
	}
	accounting := func() v1alpha1.Accounting {
		t.Helper()
		var pa v1alpha1.PodAutoscaler
		if err := o.c.Get(context.Background(), o.req.NamespacedName, &pa); err != nil {
			t.Fatal(err)
		}
		return pa.Status.Accounting
	}
	emitted := func() []string {
		var got []string
		for {
			select {
			case e := <-rec.Events:
				if strings.Contains(e, ReasonCountedPerConnection) {
					got = append(got, e)
				}
			default:
				return got
			}
		}
	}
	o.reconcile(t, o.cr)
	o.reconcile(t, o.pa)
	if got := accounting(); got != "" {
		t.Errorf("before any stats: accounting %q, want none", got)
	}

	report(5, 3, 3) // a TLS target
	o.reconcile(t, o.pa)
	if got := accounting(); got != v1alpha1.AccountingConnections {
		t.Errorf("all load opaque: accounting %q, want Connections", got)
	}
	got := emitted()
	if len(got) != 1 || !strings.HasPrefix(got[0], "Warning CountedPerConnection concurrency is connections in flight") ||
		!strings.Contains(got[0], "3.000 of the pods' 3.000") || !strings.Contains(got[0], "terminate TLS before the pods or serve h2c") {
		t.Errorf("events %q, want one Warning CountedPerConnection naming 3.000 of 3.000 and what to do", got)
	}
	for range 3 {
		report(2, 3, 3)
		o.reconcile(t, o.pa)
	}
	if got := emitted(); len(got) != 0 {
		t.Errorf("Connections still: events %q, want none", got)
	}

	report(70, 40, 0) // TLS terminated before the pods: a window of requests
	o.reconcile(t, o.pa)
	if got := accounting(); got != v1alpha1.AccountingRequests {
		t.Errorf("a window without opaque load: accounting %q, want Requests", got)
	}
	// Opaque load again: 5 s of 30 of 40 is 2.5 over the 60 s window,
	// under 10 % of 40; 15 s, about 7, is over.
	report(5, 40, 30)
	o.reconcile(t, o.pa)
	if got := accounting(); got != v1alpha1.AccountingRequests {
		t.Errorf("5 s of opaque load in a window of requests: accounting %q, want Requests", got)
	}
	report(10, 40, 30)
	o.reconcile(t, o.pa)
	if got := accounting(); got != v1alpha1.AccountingConnections {
		t.Errorf("15 s of opaque load: accounting %q, want Connections", got)
	}
	if got := emitted(); len(got) != 1 {
		t.Errorf("the second turn to Connections: events %q, want one", got)
	}
}
