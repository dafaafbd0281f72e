package collector

import (
	"fmt"
	"sync"
	"time"

	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/window"
	"github.com/sockscale/sockscale/internal/stats"
)

// Key names a target: the namespace and name of its Deployment (what the
// agents report as a pod's workload).
type Key struct{ Namespace, Name string }

func (k Key) String() string { return k.Namespace + "/" + k.Name }

// Values are one target's metric averages at one instant.
type Values struct {
	Stable, Panic float64
	// HasData is false when no source ever reported for the target.
	HasData bool
}

// Collector keeps windows for the targets it is told to watch. It is safe
// for concurrent use: batches arrive on HTTP handlers while reconcilers
// read values.
type Collector struct {
	mu      sync.Mutex
	targets map[Key]*target
}

type target struct {
	settings    config.Settings
	concurrency *window.Buckets
	rps         *window.Buckets
}

// New returns an empty collector.
func New() *Collector { return &Collector{targets: make(map[Key]*target)} }

// Watch starts (or updates) collecting for a target with these settings:
// its windows are as long as its stable window.
func (c *Collector) Watch(key Key, s config.Settings) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.targets[key]
	if !ok {
		conc, err := window.New(s.StableWindow)
		if err != nil {
			return fmt.Errorf("watch %s: %w", key, err)
		}
		rps, _ := window.New(s.StableWindow)
		c.targets[key] = &target{settings: s, concurrency: conc, rps: rps}
		return nil
	}
	t.settings = s
	if err := t.concurrency.Resize(s.StableWindow); err != nil {
		return fmt.Errorf("watch %s: %w", key, err)
	}
	return t.rps.Resize(s.StableWindow)
}

// Forget stops collecting for a target and drops its windows.
func (c *Collector) Forget(key Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.targets, key)
}

// RecordPods adds an agent's batch. A pod's requests that came through an
// activator are left out: the activator reports them itself (RecordActivator),
// and counting both would double them. It returns the watched targets that
// had requests in flight in this batch, for the caller to poke deciders
// whose last decision was zero pods.
func (c *Collector) RecordPods(b *stats.Batch) []Key {
	at := periodSecond(b.Start, b.Period)
	c.mu.Lock()
	defer c.mu.Unlock()
	var active []Key
	seen := make(map[Key]bool)
	for i := range b.Pods {
		p := &b.Pods[i]
		key := Key{p.Namespace, p.Workload}
		t, ok := c.targets[key]
		if !ok {
			continue // pods of targets nobody autoscales
		}
		conc := max(0, p.Concurrency-p.ProxiedConcurrency)
		rps := float64(p.Requests-min(p.ProxiedRequests, p.Requests)) / b.Period.Seconds()
		t.concurrency.Record(at, conc)
		t.rps.Record(at, rps)
		if p.Concurrency > 0 && !seen[key] {
			seen[key] = true
			active = append(active, key)
		}
	}
	return active
}

// RecordTargets adds an activator's batch: its target records, each through
// RecordActivator. Like RecordPods, it returns the watched targets that had
// requests in flight, so a request held for a target at zero pokes its
// decider at once.
func (c *Collector) RecordTargets(b *stats.Batch) []Key {
	var active []Key
	for i := range b.Targets {
		t := &b.Targets[i]
		key := Key{t.Namespace, t.Workload}
		if c.RecordActivator(key, b.Start, b.Period, t.Concurrency, t.Requests) && t.Concurrency > 0 {
			active = append(active, key)
		}
	}
	return active
}

// RecordActivator adds what an activator saw for a target over a period:
// the requests it held or proxied. It reports whether the target is
// watched.
func (c *Collector) RecordActivator(key Key, start time.Time, period time.Duration, concurrency float64, requests uint64) bool {
	if period <= 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.targets[key]
	if !ok {
		return false
	}
	at := periodSecond(start, period)
	t.concurrency.Record(at, max(0, concurrency))
	t.rps.Record(at, float64(requests)/period.Seconds())
	return true
}

// Values returns the target's stable and panic averages of its metric at
// now, with its aggregation algorithm.
func (c *Collector) Values(key Key, now time.Time) (Values, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.targets[key]
	if !ok {
		return Values{}, fmt.Errorf("values of %s: not watched", key)
	}
	w := t.concurrency
	if t.settings.Metric == config.MetricRPS {
		w = t.rps
	}
	avg := w.Average
	if t.settings.Aggregation == config.AggregationWeightedExponential {
		avg = w.WeightedAverage
	}
	stable, ok := avg(now, t.settings.StableWindow)
	panicValue, _ := avg(now, t.settings.PanicWindow)
	return Values{Stable: stable, Panic: panicValue, HasData: ok}, nil
}

// periodSecond is the second a period's average is recorded in: its last.
func periodSecond(start time.Time, period time.Duration) time.Time {
	return start.Add(period - time.Nanosecond)
}
