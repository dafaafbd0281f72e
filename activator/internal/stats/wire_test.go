package stats

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockscale/sockscale/activator/internal/target"
	wire "github.com/sockscale/sockscale/internal/stats"
	statsreport "github.com/sockscale/sockscale/internal/stats/report"
	"github.com/sockscale/sockscale/internal/testutil/statssink"
)

// TestWireReachesTheController sends a period's records and a poke through
// the real transport to a stand-in replica that decodes them as the
// controller does: targets are named by their Deployment, unknown ones are
// left out, and the poke arrives at once as the held count ending at the
// poke's moment.
func TestWireReachesTheController(t *testing.T) {
	got := make(chan *wire.Batch, 4)
	srv := httptest.NewServer(statssink.Handler(func(b *wire.Batch) { got <- b }))
	defer srv.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rep, err := statsreport.New(srv.Listener.Addr().String(), 5*time.Second, NewReportMetrics(prometheus.NewRegistry()), log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go rep.Run(ctx)

	hello, gone := target.Key{Namespace: "team", Name: "hello"}, target.Key{Namespace: "team", Name: "gone"}
	w := &Wire{Self: "activator-0", Sender: rep, Context: ctx, Log: log, Workload: func(k target.Key) (string, bool) {
		if k == hello {
			return "hello-deploy", true
		}
		return "", false
	}}

	at := time.Unix(1_800_000_000, 400_000_000)
	w.Poke(hello, at, 3)
	want := &wire.Batch{Node: "activator-0", Start: at.Add(-time.Millisecond), Period: time.Millisecond,
		Targets: []wire.TargetStat{{Namespace: "team", Workload: "hello-deploy", Concurrency: 3}}}
	if diff := cmp.Diff(want, receive(t, got), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("poke (-want +got):\n%s", diff)
	}

	start := time.Unix(1_800_000_000, 0)
	w.Report(start, time.Second, []Record{{Key: gone, Concurrency: 9, Requests: 9}, {Key: hello, Concurrency: 1.5, Requests: 7}})
	want = &wire.Batch{Node: "activator-0", Start: start, Period: time.Second,
		Targets: []wire.TargetStat{{Namespace: "team", Workload: "hello-deploy", Concurrency: 1.5, Requests: 7}}}
	if diff := cmp.Diff(want, receive(t, got), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}

	// A period with only unknown targets sends nothing.
	w.Report(start.Add(time.Second), time.Second, []Record{{Key: gone, Concurrency: 1}})
	w.Poke(gone, at, 1)
	select {
	case b := <-got:
		t.Errorf("sent %+v for targets with no Deployment", b)
	case <-time.After(200 * time.Millisecond):
	}
}

func receive(t *testing.T, got <-chan *wire.Batch) *wire.Batch {
	t.Helper()
	select {
	case b := <-got:
		b.Start = b.Start.In(time.Local)
		return b
	case <-time.After(5 * time.Second):
		t.Fatal("no batch reached the replica in 5 s")
		return nil
	}
}
