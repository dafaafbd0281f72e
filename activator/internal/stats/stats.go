package stats

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/sockscale/sockscale/activator/internal/target"
)

// Record is what this activator saw of one target over one period.
type Record struct {
	Key target.Key
	// Concurrency is the average number of the target's requests this
	// activator had, held or at a pod, over the period. The pods' agents
	// count the forwarded ones as proxied and the controller leaves those
	// out of the pods' share, so each request counts once.
	Concurrency float64
	// Requests is how many of the target's requests arrived in the period.
	// Arrivals, not completions: a request held while the target scales
	// from zero must count while it waits, or a target scaled on requests
	// per second would never see the load that should wake it.
	Requests uint64
}

// Reporter carries what the Counter measured to the controller; the stats
// transport implements it. Neither method may block for long: Report runs
// on the Counter's ticker, Poke on a request's goroutine.
type Reporter interface {
	// Report gives one period's records, sorted by key: every target with
	// requests in the period, and one last record after its requests end
	// so the controller sees the load drop to zero.
	Report(start time.Time, period time.Duration, records []Record)
	// Poke says a request is held for a target that has no ready pod:
	// the controller should decide for it now rather than at its next
	// tick. inFlight is the target's requests here at that instant (>= 1).
	Poke(key target.Key, at time.Time, inFlight int)
}

// DefaultPeriod matches the agents' report period and the windows' buckets.
const DefaultPeriod = time.Second

// Options configure a Counter.
type Options struct {
	Reporter Reporter
	// Period between reports (default DefaultPeriod).
	Period time.Duration
	// Clock times requests and ticks periods (default: the real clock).
	Clock clock.WithTicker
	Log   *slog.Logger
}

// Counter keeps, per target, the time integral of requests in flight with
// three additive counters (DESIGN.md): n requests in flight, s the sum of
// their start times, c the sum of the durations of those completed. At
// time t the area under in-flight(t) is
//
//	area(t) = c + n*t - s
//
// Times are offsets from the current period's start, and each report
// moves that origin to the report's instant, so the numbers stay small
// and each period's area starts at zero. Example, a period [0, 1s]:
// request A started 0.5 s before it and is still running; B runs 0.2-0.7 s.
// At 0: n=1, s=-0.5s, c=-0.5s (area 0). B begins: n=2, s=-0.3s. B ends:
// n=1, s=-0.5s, c=0. At 1 s: area = 0 + 1*1s - (-0.5s) = 1.5 s, so the
// average concurrency is 1.5 (A all along, B half the time).
type Counter struct {
	reporter Reporter
	period   time.Duration
	clock    clock.WithTicker
	log      *slog.Logger

	// mu guards targets and origin; a request holds it shared to update
	// its target's counters, a report exclusively to read and rebase them.
	mu      sync.RWMutex
	origin  time.Time
	targets map[target.Key]*counters
}

type counters struct {
	mu        sync.Mutex
	n         int64
	s, c      time.Duration // relative to Counter.origin
	arrivals  uint64
	wasActive bool // reported last period with activity
}

// New returns a Counter; Run reports from it.
func New(o Options) *Counter {
	c := &Counter{reporter: o.Reporter, period: o.Period, clock: o.Clock, log: o.Log, targets: make(map[target.Key]*counters)}
	if c.period <= 0 {
		c.period = DefaultPeriod
	}
	if c.clock == nil {
		c.clock = clock.RealClock{}
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.origin = c.clock.Now()
	return c
}

// Begin counts a request of the target from now until end is called
// (exactly once).
func (c *Counter) Begin(key target.Key) (end func()) {
	c.mu.RLock()
	if t := c.targets[key]; t != nil {
		start := c.begin(t)
		c.mu.RUnlock()
		return func() { c.end(t, start) }
	}
	c.mu.RUnlock()
	// First request of the target in a while. Counting it under the
	// exclusive lock keeps a report from dropping the new, still empty
	// entry as idle in between.
	c.mu.Lock()
	t := c.targets[key]
	if t == nil {
		t = &counters{}
		c.targets[key] = t
	}
	start := c.begin(t)
	c.mu.Unlock()
	return func() { c.end(t, start) }
}

// begin counts a request's start. c.mu must be held, shared or not.
func (c *Counter) begin(t *counters) time.Time {
	now := c.clock.Now()
	t.mu.Lock()
	t.n++
	t.s += now.Sub(c.origin)
	t.arrivals++
	t.mu.Unlock()
	return now
}

func (c *Counter) end(t *counters, start time.Time) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	now := c.clock.Now()
	st, et := start.Sub(c.origin), now.Sub(c.origin)
	t.mu.Lock()
	t.n--
	t.s -= st
	t.c += et - st
	t.mu.Unlock()
}

// Poke passes a poke for the target to the Reporter at once. The throttle
// calls it for the first request held while a target has no ready pod.
func (c *Counter) Poke(key target.Key) {
	inFlight := 1
	c.mu.RLock()
	if t := c.targets[key]; t != nil {
		t.mu.Lock()
		inFlight = max(inFlight, int(t.n))
		t.mu.Unlock()
	}
	c.mu.RUnlock()
	c.reporter.Poke(key, c.clock.Now(), inFlight)
}

// Run reports every period until ctx ends.
func (c *Counter) Run(ctx context.Context) {
	ticker := c.clock.NewTicker(c.period)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
		now := c.clock.Now()
		if start, recs := c.collect(now); len(recs) > 0 {
			c.reporter.Report(start, now.Sub(start), recs)
		}
	}
}

// collect closes the period ending now: it returns the period's start and
// its records, and starts the next period at now.
func (c *Counter) collect(now time.Time) (time.Time, []Record) {
	c.mu.Lock()
	defer c.mu.Unlock()
	start := c.origin
	d := now.Sub(start)
	if d <= 0 {
		return start, nil
	}
	var recs []Record
	for key, t := range c.targets {
		t.mu.Lock()
		area := t.c + time.Duration(t.n)*d - t.s
		active := area > 0 || t.arrivals > 0 || t.n > 0
		if active || t.wasActive {
			recs = append(recs, Record{Key: key, Concurrency: area.Seconds() / d.Seconds(), Requests: t.arrivals})
		}
		// The next period's origin is now: in-flight starts move back by d,
		// and c is set so that area(now) = c + n*0 - s = 0.
		t.s -= time.Duration(t.n) * d
		t.c = t.s
		t.arrivals = 0
		if !active && !t.wasActive {
			delete(c.targets, key) // idle two periods, nothing in flight
		}
		t.wasActive = active
		t.mu.Unlock()
	}
	c.origin = now
	slices.SortFunc(recs, func(a, b Record) int {
		return cmp.Or(cmp.Compare(a.Key.Namespace, b.Key.Namespace), cmp.Compare(a.Key.Name, b.Key.Name))
	})
	return start, recs
}
