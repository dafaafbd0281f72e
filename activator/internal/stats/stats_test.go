package stats

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/sockscale/sockscale/activator/internal/target"
)

var (
	hello = target.Key{Namespace: "default", Name: "hello"}
	world = target.Key{Namespace: "default", Name: "world"}
	t0    = time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
)

type report struct {
	Start   time.Time
	Period  time.Duration
	Records []Record
}

type poke struct {
	Key      target.Key
	At       time.Time
	InFlight int
}

type reporter struct {
	reports chan report
	pokes   chan poke
}

func newReporter() *reporter {
	return &reporter{reports: make(chan report, 100), pokes: make(chan poke, 100)}
}

func (r *reporter) Report(start time.Time, period time.Duration, recs []Record) {
	r.reports <- report{start, period, recs}
}
func (r *reporter) Poke(k target.Key, at time.Time, n int) { r.pokes <- poke{k, at, n} }

func (r *reporter) next(t *testing.T) report {
	t.Helper()
	select {
	case rep := <-r.reports:
		return rep
	case <-time.After(10 * time.Second):
		t.Fatal("no report")
		return report{}
	}
}

// approx compares concurrencies computed from float seconds.
var approx = cmpopts.EquateApprox(0, 1e-9)

// TestAverageConcurrency follows two targets over four periods:
//
//	t0        A (hello) begins                       -- it runs 1.25 s
//	t0+0.2s   B (hello) begins
//	t0+0.7s   B ends                                 -- hello: 1 + 0.5 = 1.5
//	t0+0.9s   C (world) begins and ends at t0+1.0s  -- world: 0.1
//	t0+1s     report 1
//	t0+1.25s  A ends                                 -- hello: 0.25
//	t0+2s     report 2: hello 0.25; world's last record, 0
//	t0+3s     report 3: hello's last record, 0
//	t0+4s     nothing to report, and hello is forgotten
func TestAverageConcurrency(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	rep := newReporter()
	c := New(Options{Reporter: rep, Clock: clk})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer cancel()
	for !clk.HasWaiters() { // Run's ticker exists
		time.Sleep(time.Millisecond)
	}

	endA := c.Begin(hello)
	clk.Step(200 * time.Millisecond)
	endB := c.Begin(hello)
	clk.Step(500 * time.Millisecond)
	endB()
	clk.Step(200 * time.Millisecond)
	endC := c.Begin(world)
	clk.Step(100 * time.Millisecond)
	endC()
	got := rep.next(t) // t0+1s
	want := report{t0, time.Second, []Record{{hello, 1.5, 2}, {world, 0.1, 1}}}
	if diff := cmp.Diff(want, got, approx); diff != "" {
		t.Errorf("report 1 (-want +got):\n%s", diff)
	}

	clk.Step(250 * time.Millisecond)
	endA()
	clk.Step(750 * time.Millisecond)
	want = report{t0.Add(time.Second), time.Second, []Record{{hello, 0.25, 0}, {world, 0, 0}}}
	if diff := cmp.Diff(want, rep.next(t), approx); diff != "" {
		t.Errorf("report 2 (-want +got):\n%s", diff)
	}

	clk.Step(time.Second)
	want = report{t0.Add(2 * time.Second), time.Second, []Record{{hello, 0, 0}}}
	if diff := cmp.Diff(want, rep.next(t), approx); diff != "" {
		t.Errorf("report 3 (-want +got):\n%s", diff)
	}
	// t0+4s: nothing to report. Run is stopped first so the period is
	// closed here, not on its goroutine at a moment the test cannot see.
	cancel()
	<-done
	clk.Step(time.Second)
	if _, recs := c.collect(clk.Now()); recs != nil {
		t.Errorf("report 4 = %v, want none", recs)
	}
	if len(c.targets) != 0 {
		t.Errorf("idle targets kept: %v", c.targets)
	}
}

func TestLongRequestSpansPeriods(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	c := New(Options{Reporter: newReporter(), Clock: clk})
	end := c.Begin(hello)
	var got []float64
	for range 5 {
		clk.Step(time.Second)
		_, recs := c.collect(clk.Now())
		got = append(got, recs[0].Concurrency)
	}
	clk.Step(400 * time.Millisecond)
	end()
	clk.Step(600 * time.Millisecond)
	_, recs := c.collect(clk.Now())
	got = append(got, recs[0].Concurrency)
	if diff := cmp.Diff([]float64{1, 1, 1, 1, 1, 0.4}, got, approx); diff != "" {
		t.Errorf("concurrency per period (-want +got):\n%s", diff)
	}
}

func TestPoke(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	rep := newReporter()
	c := New(Options{Reporter: rep, Clock: clk})
	c.Poke(hello) // no request counted yet: still at least 1
	end1, end2 := c.Begin(hello), c.Begin(hello)
	c.Poke(hello)
	end1()
	end2()
	got := []poke{<-rep.pokes, <-rep.pokes}
	if diff := cmp.Diff([]poke{{hello, t0, 1}, {hello, t0, 2}}, got); diff != "" {
		t.Errorf("pokes (-want +got):\n%s", diff)
	}
}

// TestConcurrentRequests: requests begin and end on many goroutines while
// periods close; every arrival is reported once and the load ends at zero.
func TestConcurrentRequests(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	c := New(Options{Reporter: newReporter(), Clock: clk})
	const goroutines, each = 16, 500
	var wg sync.WaitGroup
	for g := range goroutines {
		key := hello
		if g%2 == 1 {
			key = world
		}
		wg.Go(func() {
			for range each {
				c.Begin(key)()
			}
		})
	}
	var arrivals uint64
	stop := make(chan struct{})
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for {
			clk.Step(time.Millisecond)
			_, recs := c.collect(clk.Now())
			for _, r := range recs {
				arrivals += r.Requests
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	wg.Wait()
	close(stop)
	<-collected
	clk.Step(time.Millisecond)
	_, recs := c.collect(clk.Now())
	for _, r := range recs {
		arrivals += r.Requests
		if r.Concurrency != 0 {
			t.Errorf("%s: concurrency %v after every request ended", r.Key, r.Concurrency)
		}
	}
	if arrivals != goroutines*each {
		t.Errorf("reported %d arrivals, want %d", arrivals, goroutines*each)
	}
}
