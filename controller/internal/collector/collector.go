package collector

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/window"
	"github.com/sockscale/sockscale/internal/stats"
)

// Key names a target: the namespace and name of the workload it scales
// (its Deployment, StatefulSet, ...: what the agents report as a pod's
// workload, the pod's owner or its ReplicaSet's).
type Key struct{ Namespace, Name string }

func (k Key) String() string { return k.Namespace + "/" + k.Name }

// Values are one target's metric averages at one instant.
type Values struct {
	Stable, Panic float64
	// HasData is false when no second of the stable window has a value:
	// no source ever reported for the target, or too few of its ready
	// pods were heard for the whole window.
	HasData bool
	// Expected is how many ready pods the target has (Expect). Missing is
	// how many of them sent no stats for StaleAfter, on MissingNodes.
	Expected, Missing int
	MissingNodes      []string
	// Extrapolating: some are missing but enough were heard, so their
	// load is estimated from the others'; with some missing and not
	// Extrapolating, the windows hold what came before.
	Extrapolating bool
	// Accounting is how the pods' load was counted over the stable
	// window.
	Accounting Accounting
}

// Accounting is how a target's pods counted their load over its stable
// window (their records' stats.Accounting and OpaqueConcurrency).
type Accounting struct {
	// HasData: some pod of the target reported within the window.
	HasData bool
	// Concurrency is the pods' average requests in flight over the
	// window's complete seconds, those that came through activators
	// included, and Opaque the part of it on connections counted per
	// connection: each such connection one request in flight for its
	// whole life.
	Concurrency, Opaque float64
	// ConnectionPods is how many of the pods reported being counted per
	// connection within the window.
	ConnectionPods int
}

// StaleAfter is how long a source (a pod's agent, an activator) may go
// without a report before the collector stops waiting for it: two report
// periods. A source that reported within it holds back which seconds are
// complete; one that did not is missing.
const StaleAfter = 2 * time.Second

// pokeMaxPeriod tells an activator's poke (a report of what it holds at
// one instant, claiming 1 ms) from its period reports (1 s).
const pokeMaxPeriod = 100 * time.Millisecond

// Collector keeps windows for the targets it is told to watch. It is safe
// for concurrent use: batches arrive on HTTP handlers while reconcilers
// read values.
//
// # Timeline
//
// Reports are placed on the collector's own clock, where they arrive, not
// by the reporter's wall clock (agents' clocks differ, and a clock ahead
// or behind would put its pods' load into seconds the others do not fill).
// A source's first report of period p arriving at t covers [t-p, t);
// what it says (the time integral of concurrency, the requests) is spread
// over the seconds it covers in proportion to the overlap. Its reports
// tile its timeline: one that follows on from the previous one on the
// reporter's clock covers the next p after it (never past its own
// arrival), so jitter in arrival moves no load between seconds; one after
// a gap starts at t-p or where the previous one ended, whichever is
// later. Example: three periods of 10 in flight, one after the other,
// arriving at 10.5 s, 11.7 s and 12.5 s: the first covers [9.5, 10.5) and
// puts 5 into second 9 and 5 into second 10, the second (late)
// [10.5, 11.5), the third [11.5, 12.5), so seconds 10 and 11 hold 10
// each.
//
// # Complete seconds
//
// The windows average complete seconds only: those every live source has
// reported past. The seconds after the oldest live source's last report
// are still being reported and are left out, not read as zeros (with a
// true concurrency of 10 reported at mid-second, a read just after a
// second boundary would otherwise see 59 seconds of 10 and one of 0: 9.83
// over 60 s, 8.33 over 6 s, 5.0 over 2 s). The sources waited for are the
// activators and the ready pods (all pods until Expect says which are
// ready); one silent for StaleAfter no longer holds the seconds back.
//
// One exception: an activator's poke, the first request held for a target
// at zero, is a point sample. It is added to its second as a whole
// second's concurrency (as Knative records it) and that second counts at
// once, so the decider woken by the poke sees it; the activator's next
// period report covers the same time again, which counts the held requests
// about twice for that one second.
//
// # Missing data
//
// Missing data is not zero load. The collector is told which ready pods
// each target has (Expect, from its private Service's endpoints) and
// counts, per second, how much of that second each of them reported. A
// second some expected pods did not report is completed as Knative
// completes a scrape that reached only a sample of the pods: when at
// least Knative's sample size of them was heard (all of up to 3 pods, 4
// of 5, 7 of 10, 14 of 100: n = ceil(N x 15.37 / (N + 14.37))), the
// missing ones are counted at the mean of those heard; with fewer, the
// second has no value at all and the windows average the seconds that
// have one, so the decision holds to what was last known instead of
// reading a dead agent's node as idle. Example: 5 ready pods, the agent of
// the node with 1 of them crashed, the 4 heard carry 40 in flight: the
// second reads 40 + 1 x 40/4 = 50.
//
// # Locking
//
// mu guards the targets map only, and each target has its own lock: agents'
// batches (5,000 a second with 100 records each at 5,000 nodes) and the
// reconcilers' reads (10,000 targets every 2 s) of different targets do not
// wait for each other. A batch takes mu for reading once, and each of its
// records its target's lock; only Watch of a new target and Forget take
// mu for writing. Lock order: mu, then a target's.
type Collector struct {
	mu      sync.RWMutex
	clock   clock.PassiveClock
	targets map[Key]*target
}

type target struct {
	// mu guards every field below.
	mu       sync.Mutex
	settings config.Settings
	ring     *window.Ring[second]
	// pods are what the target knows of each pod address (podState), and
	// activators where each one's reports have reached, by name.
	pods       map[addrKey]*podState
	activators map[string]*source
	// poked is the arrival of the latest poke.
	poked time.Time
	// since is the first second every source of the target's cold start
	// covers whole (see spread): earlier ones do not count.
	since int64
	// started is when the ring was first written.
	started time.Time
	// How many pods were expected (podState.expected) in a second is base
	// plus the changes from then or before (sorted by second).
	base    int
	changes []change
	// told: Expect was called; until then every pod is waited for.
	told bool
	// podHeard is the arrival of the latest pod report, in Unix
	// nanoseconds (0: none since the start or Restart).
	podHeard int64
	// owners are the PodAutoscalers that watch the target (Watch); the
	// last one's Forget drops it and sets forgotten.
	owners    map[Key]struct{}
	forgotten bool
}

// podState is one address of a target, in a single entry so that an agent's
// record costs one lookup (5,000 agents send 500,000 records a second):
// where its reports reached, the seconds it was expected in, and whether
// it is a member now. An entry lives while any of the three matters
// (prune).
type podState struct {
	// src is where its reports have reached (src.until == 0: none yet,
	// or none within the window).
	src source
	// expected, when isExpected, is the ready pod (Expect), or one that
	// recently was: it counts as heard in the seconds it was expected.
	expected   expectedPod
	isExpected bool
	// member: the pod is one of the target's now, ready or not, on
	// memberNode (Members).
	member     bool
	memberNode string
	// connectionsAt is the arrival of its latest report counted per
	// connection (stats.AccountingConnections), in Unix nanoseconds; 0:
	// none.
	connectionsAt int64
}

// expectedPod is a ready pod: its node, and the seconds it is expected in
// (from..until, until = math.MaxInt64 while it is ready).
type expectedPod struct {
	node        string
	from, until int64
}

// podAt returns the entry of ip, made if there is none.
func (t *target) podAt(ip addrKey) *podState {
	p := t.pods[ip]
	if p == nil {
		p = &podState{}
		t.pods[ip] = p
	}
	return p
}

// change: from second from on, delta more pods were expected.
type change struct {
	from  int64
	delta int
}

// addrKey is a pod's address (podaddr.Canonical: IPv4, or IPv6 for an
// IPv6-only pod) as a map key, IPv4 as IPv4-mapped IPv6: 16 plain bytes
// hash several times faster than a netip.Addr, whose zone is a pointer.
type addrKey [16]byte

// addrKeyOf returns a's key; false for the zero Addr, which no pod has.
func addrKeyOf(a netip.Addr) (addrKey, bool) {
	if !a.IsValid() {
		return addrKey{}, false
	}
	return addrKey(a.Unmap().As16()), true
}

// source is one reporter of a target's load.
type source struct {
	// until is the end of what it reported, on the collector's clock, in
	// Unix nanoseconds; 0 before its first report. It is at or before
	// heard, its last report's arrival (see spread).
	until, heard int64
	// reporterEnd is the end of its last report's period on the
	// reporter's own clock (Start + Period), in Unix nanoseconds: a
	// report that starts there follows on without a gap, however late it
	// arrives.
	reporterEnd int64
}

// lagCreep and maxLag bound how far behind its arrivals a source's
// timeline may sit (see spread).
const (
	lagCreep = time.Millisecond
	maxLag   = time.Second
)

// contiguousSlack is how far a report's start may be from the end of the
// same reporter's previous one and still follow on from it (the wire
// keeps nanoseconds; this forgives a reporter that rounds).
const contiguousSlack = int64(time.Millisecond)

// follows says whether a report of [start, start+p) on the reporter's
// clock follows on from src's previous one, and records its end.
func (src *source) follows(start time.Time, p time.Duration) bool {
	s := start.UnixNano()
	ok := src.reporterEnd != 0 && s-src.reporterEnd <= contiguousSlack && src.reporterEnd-s <= contiguousSlack
	src.reporterEnd = s + int64(p)
	return ok
}

// second is what a target's sources reported about one second:
// concurrency as its time integral over the second (so, once the second
// is complete, its average), and requests; then the part of those from
// the expected pods, and how many pod-seconds of it they covered.
type second struct {
	concurrency, requests           float64
	heardConcurrency, heardRequests float64
	heard                           float64
	// podConcurrency is the pods' concurrency, proxied included, and
	// opaqueConcurrency the part of it on connections counted per
	// connection: for the target's accounting, not its value.
	podConcurrency, opaqueConcurrency float64
}

// New returns an empty collector that places reports on clk's timeline.
func New(clk clock.PassiveClock) *Collector {
	return &Collector{clock: clk, targets: make(map[Key]*target)}
}

// Watch starts (or updates) collecting for a target with these settings
// on behalf of by (its PodAutoscaler): its windows are as long as its
// stable window. Several PodAutoscalers may watch one target (one
// Deployment); the latest Watch's settings apply, and the windows stay
// until the last of them forgets it.
func (c *Collector) Watch(key, by Key, s config.Settings) error {
	for {
		t := c.target(key)
		if t == nil {
			ring, err := window.New[second](ringLength(s))
			if err != nil {
				return fmt.Errorf("watch %s: %w", key, err)
			}
			c.mu.Lock()
			if c.targets[key] == nil { // else another Watch made it meanwhile
				c.targets[key] = &target{settings: s, ring: ring, pods: make(map[addrKey]*podState), activators: make(map[string]*source),
					owners: map[Key]struct{}{by: {}}}
				c.mu.Unlock()
				return nil
			}
			c.mu.Unlock()
			continue
		}
		t.mu.Lock()
		if t.forgotten { // its last watcher forgot it meanwhile: make it anew
			t.mu.Unlock()
			continue
		}
		t.owners[by] = struct{}{}
		t.settings = s
		err := t.ring.Resize(ringLength(s))
		t.mu.Unlock()
		if err != nil {
			return fmt.Errorf("watch %s: %w", key, err)
		}
		return nil
	}
}

// ringLength is how many seconds a target's ring keeps: its stable
// window, plus the seconds still being reported after the newest complete
// one (up to StaleAfter and the second it ends in).
func ringLength(s config.Settings) time.Duration {
	return s.StableWindow + StaleAfter + time.Second
}

// Len is how many targets the collector keeps windows for.
func (c *Collector) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.targets)
}

// target returns the target of key, nil if it is not watched.
func (c *Collector) target(key Key) *target {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.targets[key]
}

// Restart drops what a target's windows hold, as at a cold start: its
// values average only the seconds reported from now on, and until a
// source reports it has no data (the decider then holds its scale). What
// it was told of its pods (Expect, Members) stays. A replica that wins a
// bucket calls it for the bucket's targets: it got none of their records
// while another replica held them, and the seconds between what it kept
// from before and now would otherwise read as zeros.
func (c *Collector) Restart(key Key) {
	t := c.target(key)
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ring.Reset()
	for _, p := range t.pods {
		p.src = source{}
		p.connectionsAt = 0
	}
	t.podHeard = 0
	t.activators = make(map[string]*source)
	t.poked, t.since, t.started = time.Time{}, 0, time.Time{}
}

// Forget stops collecting for a target on behalf of by, and drops its
// windows when no one else watches it.
func (c *Collector) Forget(key, by Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.targets[key]
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.owners, by)
	if len(t.owners) == 0 {
		t.forgotten = true
		delete(c.targets, key)
	}
}

// RecordPods adds an agent's batch. A pod's requests that came through an
// activator are left out: the activator reports them itself (RecordActivator),
// and counting both would double them. It returns the watched targets that
// had requests in flight in this batch, for the caller to poke deciders
// whose last decision was zero pods: a target whose records are not next
// to each other may be named more than once (deduplicating 100 records
// per batch in a map cost more than the poke's lookups of the repeats).
func (c *Collector) RecordPods(b *stats.Batch) []Key {
	now := c.clock.Now()
	c.mu.RLock()
	defer c.mu.RUnlock()
	var active []Key
	for i := range b.Pods {
		p := &b.Pods[i]
		key := Key{p.Namespace, p.Workload}
		t, ok := c.targets[key]
		ip, valid := addrKeyOf(p.IP)
		if !ok || !valid {
			continue // pods of targets nobody autoscales (stats.Decode gives no invalid address)
		}
		t.mu.Lock()
		entry := t.podAt(ip)
		var exp *expectedPod
		if t.told && entry.isExpected {
			exp = &entry.expected
		}
		l := load{
			concurrency: max(0, p.Concurrency-p.ProxiedConcurrency), requests: float64(p.Requests - min(p.ProxiedRequests, p.Requests)),
			podConcurrency: p.Concurrency, opaqueConcurrency: min(p.OpaqueConcurrency, p.Concurrency),
		}
		t.spread(&entry.src, now, b.Period, entry.src.follows(b.Start, b.Period), l, exp)
		t.podHeard = now.UnixNano()
		if p.Accounting == stats.AccountingConnections {
			entry.connectionsAt = t.podHeard
		}
		t.mu.Unlock()
		if p.Concurrency > 0 && (len(active) == 0 || active[len(active)-1] != key) {
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
		if c.RecordActivator(key, b.Node, b.Start, b.Period, t.Concurrency, t.Requests) && t.Concurrency > 0 {
			active = append(active, key)
		}
	}
	return active
}

// RecordActivator adds what an activator (named by its batches' Node)
// saw for a target over the period [start, start+period) of its own clock,
// which ended when the report arrived: the requests it held or proxied. A
// period shorter than pokeMaxPeriod is a poke (see Collector). It reports
// whether the target is watched.
func (c *Collector) RecordActivator(key Key, activator string, start time.Time, period time.Duration, concurrency float64, requests uint64) bool {
	if period <= 0 {
		return false
	}
	now := c.clock.Now()
	t := c.target(key)
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if period < pokeMaxPeriod {
		if b := t.ring.At(now.Unix()); b != nil {
			b.concurrency += max(0, concurrency)
			b.requests += float64(requests)
		}
		t.poked = now
		return true
	}
	src := t.activators[activator]
	if src == nil {
		src = &source{}
		t.activators[activator] = src
	}
	t.spread(src, now, period, src.follows(start, period), load{concurrency: max(0, concurrency), requests: float64(requests)}, nil)
	return true
}

// Values returns the target's stable and panic averages of its metric at
// now, with its aggregation algorithm, over the complete seconds (see
// Collector).
func (c *Collector) Values(key Key, now time.Time) (Values, error) {
	t := c.target(key)
	if t == nil {
		return Values{}, fmt.Errorf("values of %s: not watched", key)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.prune(now)
	newest := t.newestComplete(now)
	n := int(t.settings.StableWindow / time.Second)
	seconds := make([]float64, 0, n)
	var pods, opaque float64 // summed over the seconds
	for age := range n {
		sec := newest - int64(age)
		b, ok := t.ring.Get(sec)
		if !ok || sec < t.since {
			break
		}
		seconds = append(seconds, t.value(sec, b))
		pods += b.podConcurrency
		opaque += b.opaqueConcurrency
	}
	avg := window.Linear
	if t.settings.Aggregation == config.AggregationWeightedExponential {
		avg = func(v []float64) (float64, bool) { return window.WeightedExponential(v, n) }
	}
	v := t.missing(now)
	v.Stable, v.HasData = avg(seconds[:min(n, len(seconds))])
	var ok bool
	if v.Panic, ok = avg(seconds[:min(int(t.settings.PanicWindow/time.Second), len(seconds))]); !ok {
		// No second of the panic window has a value: hold the stable
		// value rather than read a burst or a lull into the gap.
		v.Panic = v.Stable
	}
	v.Accounting = t.accounting(now, pods, opaque, len(seconds))
	return v, nil
}

// accounting is the target's Accounting at now, from the pods'
// concurrency and opaque concurrency summed over the stable window's n
// complete seconds.
func (t *target) accounting(now time.Time, pods, opaque float64, n int) Accounting {
	window := int64(t.settings.StableWindow)
	a := Accounting{HasData: t.podHeard != 0 && now.UnixNano()-t.podHeard <= window}
	if n > 0 {
		a.Concurrency, a.Opaque = pods/float64(n), opaque/float64(n)
	}
	for _, p := range t.pods {
		if p.connectionsAt != 0 && now.UnixNano()-p.connectionsAt <= window {
			a.ConnectionPods++
		}
	}
	return a
}
