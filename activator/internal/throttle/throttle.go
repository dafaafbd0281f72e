package throttle

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/sockscale/sockscale/activator/internal/target"
)

// Errors of Try, checked with errors.Is. A client that goes away while
// held gets its context's cause (context.Canceled) instead.
var (
	// ErrQueueFull: the target already holds as many requests as the
	// queue depth allows.
	ErrQueueFull = errors.New("queue full")
	// ErrDeadline: the context's deadline (the target's request timeout)
	// passed before a pod slot was free.
	ErrDeadline = errors.New("deadline passed while held")
	// ErrUnknownTarget: Update was never called for the target, or it was
	// deleted.
	ErrUnknownTarget = errors.New("unknown target")
	// ErrTargetRemoved: the target was deleted while the request was held.
	ErrTargetRemoved = errors.New("target removed")
	// ErrPodUnreachable is for fn to wrap when it could not reach the pod
	// and sent it nothing (the connection was refused or timed out): Try
	// takes the pod out of the ready set and hands the request to another
	// pod, or holds it again until one is ready.
	ErrPodUnreachable = errors.New("pod unreachable")
)

// maxUnreachable is how many pods in a row may fail to connect before Try
// gives up with fn's error: a request is not held to its deadline when
// every pod is unreachable (a network fault, not a cold start).
const maxUnreachable = 3

// DefaultQueueDepth is how many requests a target may have held at once.
const DefaultQueueDepth = 10000

// unlimited is the per-pod slot count when containerConcurrency is 0.
const unlimited = math.MaxInt

// Options configure a Throttler.
type Options struct {
	// Self is this activator's pod name, as it appears in targets'
	// activator lists.
	Self string
	// QueueDepth bounds each target's held requests where its Settings
	// do not (0: DefaultQueueDepth).
	QueueDepth int
	// OnCold, if set, is called when a request starts waiting for a target
	// that has no ready pod and held none before: the first request of a
	// scale from zero. It runs on the request's goroutine and must not
	// block (the wiring pokes the controller from it).
	OnCold func(target.Key)
	// OnUnreachable, if set, is told of a pod that fn could not reach
	// (ErrPodUnreachable). The throttle stops using the pod at once; the
	// wiring has the readiness prober probe it until it answers again.
	OnUnreachable func(target.Key, netip.AddrPort)
	// Clock times waits and cold starts (default: the real clock).
	Clock clock.PassiveClock
	// Registerer gets the throttle's metrics (nil: not registered).
	Registerer prometheus.Registerer
	Log        *slog.Logger
}

// Settings are a target's capacity inputs from its PodAutoscaler and
// ServerlessService.
type Settings struct {
	// ContainerConcurrency is the most requests a pod takes at once from
	// all activators together; 0 is unlimited.
	ContainerConcurrency int
	// Activators are the names of the activator pods in the target's path
	// (any order): with this activator among them, it uses only its share
	// of the pods (see share).
	Activators []string
	// QueueDepth bounds the target's held requests, up to the
	// throttler's (Options.QueueDepth: the cluster's cap); 0: the
	// throttler's.
	QueueDepth int
}

// Slot is what Try hands fn: the pod whose slot the request has, and how
// the request came by it.
type Slot struct {
	// Dest is the pod's address.
	Dest netip.AddrPort
	// ColdStart: the request waited while its target had no ready pod
	// (it was held through a cold start), for Waited from its arrival.
	ColdStart bool
	Waited    time.Duration
}

// Throttler holds requests per target. Its methods are safe for
// concurrent use.
type Throttler struct {
	self          string
	depth         int
	onCold        func(target.Key)
	onUnreachable func(target.Key, netip.AddrPort)
	clock         clock.PassiveClock
	m             *metrics
	log           *slog.Logger

	mu     sync.RWMutex
	queues map[target.Key]*queue
}

// New returns a Throttler with no targets.
func New(o Options) *Throttler {
	t := &Throttler{self: o.Self, depth: o.QueueDepth, onCold: o.OnCold, onUnreachable: o.OnUnreachable, clock: o.Clock, m: newMetrics(o.Registerer), log: o.Log, queues: make(map[target.Key]*queue)}
	if t.depth <= 0 {
		t.depth = DefaultQueueDepth
	}
	if t.clock == nil {
		t.clock = clock.RealClock{}
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	return t
}

// queue is one target's state: its pods and the requests waiting for one.
type queue struct {
	key target.Key
	t   *Throttler
	m   targetMetrics

	mu         sync.Mutex
	cc         int
	depth      int                     // the most requests held at once
	activators []string                // sorted
	pods       map[netip.AddrPort]*pod // ready pods, and unready ones still serving requests
	assigned   []*pod                  // ready pods this activator uses, sorted by address
	readyPods  int                     // ready pods, assigned or not
	next       int                     // rotates the start of the CC > 0 scan so ties spread
	waiters    list.List               // of *waiter, oldest first
	coldSince  time.Time               // first request held while no pod was ready; zero: not cold
	removed    bool
}

type pod struct {
	addr     netip.AddrPort
	inFlight int  // requests this activator has at the pod
	slots    int  // the most it may have: its share of containerConcurrency; 0: not ours
	ready    bool // still in the ready set (an unready pod finishes what it has)
}

type waiter struct {
	grant   chan grant // buffered: dispatch never blocks
	elem    *list.Element
	granted bool // set, with the send, under the queue's lock
	cold    bool // the target had no ready pod when it began to wait
}

type grant struct {
	pod *pod
	err error
}

// Update adds the target or changes its settings.
func (t *Throttler) Update(key target.Key, s Settings) error {
	if s.ContainerConcurrency < 0 {
		return fmt.Errorf("update %s: containerConcurrency %d: must be 0 (unlimited) or more", key, s.ContainerConcurrency)
	}
	if s.QueueDepth < 0 {
		return fmt.Errorf("update %s: queue depth %d: must be 0 (the activator's, %d) or more", key, s.QueueDepth, t.depth)
	}
	t.mu.Lock()
	q := t.queues[key]
	if q == nil {
		q = &queue{key: key, t: t, m: t.m.forTarget(key), pods: make(map[netip.AddrPort]*pod)}
		t.queues[key] = q
	}
	t.mu.Unlock()

	activators := slices.Clone(s.Activators)
	slices.Sort(activators)
	q.mu.Lock()
	defer q.mu.Unlock()
	q.cc = s.ContainerConcurrency
	// A lower depth keeps the requests already held; it refuses new ones
	// until the queue is under it.
	q.depth = min(cmp.Or(s.QueueDepth, t.depth), t.depth)
	q.activators = slices.Compact(activators)
	q.assign()
	q.dispatch()
	return nil
}

// SetPods replaces the target's ready pods. A pod that leaves the set
// finishes the requests it has but gets no new ones. Pods of a target
// Update never added are ignored: the wiring adds targets first.
func (t *Throttler) SetPods(key target.Key, ready []netip.AddrPort) {
	q := t.queue(key)
	if q == nil {
		t.log.Debug("pods for an unknown target ignored", "target", key, "pods", len(ready))
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, p := range q.pods {
		p.ready = false
	}
	for _, a := range ready {
		p := q.pods[a]
		if p == nil {
			p = &pod{addr: a}
			q.pods[a] = p
		}
		p.ready = true
	}
	for a, p := range q.pods {
		if !p.ready && p.inFlight == 0 {
			delete(q.pods, a)
		}
	}
	q.assign()
	q.dispatch()
	if q.waiters.Len() == 0 {
		q.coldSince = time.Time{} // pods came with nobody waiting: nothing to time
	}
}

// Delete removes the target. Its held requests fail with ErrTargetRemoved;
// those already at a pod finish.
func (t *Throttler) Delete(key target.Key) {
	t.mu.Lock()
	q := t.queues[key]
	delete(t.queues, key)
	t.mu.Unlock()
	if q == nil {
		return
	}
	q.mu.Lock()
	q.removed = true
	for e := q.waiters.Front(); e != nil; e = e.Next() {
		w := e.Value.(*waiter)
		w.granted = true
		w.grant <- grant{err: fmt.Errorf("%w: %s was deleted while the request was held", ErrTargetRemoved, key)}
	}
	q.waiters.Init()
	q.mu.Unlock()
	t.m.forget(key)
}

// Held is how many requests wait for a slot of the target now.
func (t *Throttler) Held(key target.Key) int {
	q := t.queue(key)
	if q == nil {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waiters.Len()
}

func (t *Throttler) queue(key target.Key) *queue {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.queues[key]
}

// Try runs fn with the address of a pod of the target that has a free
// slot, waiting in the target's queue (oldest first) until one is free or
// ctx ends. The slot is taken until fn returns. Waiting costs no goroutine
// beyond the caller's. If fn's error wraps ErrPodUnreachable, the pod is
// taken out and fn runs again with another (up to maxUnreachable pods).
// Errors: ErrQueueFull, ErrDeadline, ErrUnknownTarget, ErrTargetRemoved,
// the cause of ctx's cancellation, or fn's error.
func (t *Throttler) Try(ctx context.Context, key target.Key, fn func(Slot) error) error {
	q := t.queue(key)
	if q == nil {
		return fmt.Errorf("%w %s", ErrUnknownTarget, key)
	}
	start := t.clock.Now()
	coldStart := false
	for attempt := 1; ; attempt++ {
		p, cold, err := q.acquire(ctx, start)
		if err != nil {
			return err
		}
		waited := t.clock.Since(start)
		// A request that came back for another pod stays cold if it was
		// held through the cold start the first time.
		coldStart = coldStart || cold
		err = q.run(p, Slot{Dest: p.addr, ColdStart: coldStart, Waited: waited}, fn)
		if !errors.Is(err, ErrPodUnreachable) {
			q.m.wait.Observe(waited.Seconds()) // once a request, for the slot it was served on
			return err
		}
		q.m.unreachable.Inc()
		t.log.Warn("pod unreachable, the request goes to another", "target", key, "pod", p.addr, "attempt", attempt, "err", err)
		if t.onUnreachable != nil {
			t.onUnreachable(key, p.addr)
		}
		if attempt == maxUnreachable || ctx.Err() != nil {
			return fmt.Errorf("%d pods in a row could not be reached, the last %v: %w", attempt, p.addr, err)
		}
	}
}

// acquire takes a free slot for a request that arrived at start: at once,
// or after waiting in the queue; cold says it waited while the target had
// no ready pod.
func (q *queue) acquire(ctx context.Context, start time.Time) (p *pod, cold bool, err error) {
	t, key := q.t, q.key
	q.mu.Lock()
	if q.removed {
		q.mu.Unlock()
		return nil, false, fmt.Errorf("%w %s", ErrUnknownTarget, key)
	}
	if p := q.pick(); p != nil {
		p.inFlight++
		q.mu.Unlock()
		return p, false, nil
	}
	if depth := q.depth; q.waiters.Len() >= depth {
		q.mu.Unlock()
		q.m.queueFull.Inc()
		return nil, false, fmt.Errorf("%w: %s already holds %d requests, its queue depth", ErrQueueFull, key, depth)
	}
	w := &waiter{grant: make(chan grant, 1), cold: q.readyPods == 0}
	w.elem = q.waiters.PushBack(w)
	first := q.readyPods == 0 && q.coldSince.IsZero()
	if first {
		q.coldSince = start
	}
	q.mu.Unlock()
	q.m.held.Inc()
	if first && t.onCold != nil {
		t.onCold(key)
	}

	select {
	case g := <-w.grant:
		q.m.held.Dec()
		if g.err != nil {
			q.m.removed.Inc()
			return nil, false, g.err
		}
		return g.pod, w.cold, nil
	case <-ctx.Done():
	}

	// Gone or timed out. Its place is freed now; if a pod was handed to it
	// at the same moment, the slot goes straight back to the next waiter.
	q.m.held.Dec()
	q.mu.Lock()
	granted := w.granted
	if !granted {
		q.waiters.Remove(w.elem)
		if q.waiters.Len() == 0 && q.readyPods == 0 {
			q.coldSince = time.Time{} // everyone gave up: the next request pokes again
		}
	}
	why := q.whyNoSlot()
	q.mu.Unlock()
	if granted {
		if g := <-w.grant; g.pod != nil {
			q.release(g.pod, false)
		}
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		q.m.deadline.Inc()
		return nil, false, fmt.Errorf("%w: %s: held %v and %s", ErrDeadline, key, t.clock.Since(start).Round(time.Millisecond), why)
	}
	q.m.canceled.Inc()
	return nil, false, context.Cause(ctx)
}

// run calls fn with the slot and gives it back after, even if fn panics
// (httputil.ReverseProxy aborts a broken response by panic).
func (q *queue) run(p *pod, s Slot, fn func(Slot) error) (err error) {
	q.m.forwarded.Inc()
	q.m.forwarding.Inc()
	defer func() {
		q.m.forwarding.Dec()
		q.release(p, errors.Is(err, ErrPodUnreachable))
	}()
	return fn(s)
}

// release gives back p's slot. An unreachable pod leaves the ready set
// first, so that the slot is not handed to the next waiter: the readiness
// prober brings it back once it answers a probe (OnUnreachable).
func (q *queue) release(p *pod, unreachable bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	p.inFlight--
	if unreachable && p.ready && q.pods[p.addr] == p {
		p.ready = false
		q.assign()
	}
	if !p.ready && p.inFlight == 0 && q.pods[p.addr] == p {
		delete(q.pods, p.addr)
	}
	q.dispatch()
}

// dispatch hands free slots to waiters, oldest first. q.mu must be held.
func (q *queue) dispatch() {
	for q.waiters.Len() > 0 {
		p := q.pick()
		if p == nil {
			return
		}
		p.inFlight++
		w := q.waiters.Remove(q.waiters.Front()).(*waiter)
		w.granted = true
		w.grant <- grant{pod: p}
		if !q.coldSince.IsZero() {
			waited := q.t.clock.Since(q.coldSince)
			q.m.coldStart.Observe(waited.Seconds())
			q.t.log.Info("first held request handed to a pod", "target", q.key, "pod", p.addr, "coldStart", waited)
			q.coldSince = time.Time{}
		}
	}
}

// pick returns an assigned pod with a free slot, or nil. q.mu must be held.
//
// containerConcurrency 0: power of two choices: of two pods drawn at
// random, the one with fewer requests in flight. It balances nearly as
// well as a full scan at O(1), and two activators choosing at once do not
// herd onto the same least-loaded pod.
//
// containerConcurrency > 0: the pod with the most free slots, scanning
// from a start that rotates so equal pods take turns. Pods per activator
// are few (pods / activators) and the scan must see every pod anyway to
// find one that is not full.
func (q *queue) pick() *pod {
	n := len(q.assigned)
	switch {
	case n == 0:
		return nil
	case q.cc == 0:
		if n == 1 {
			return q.assigned[0]
		}
		i := rand.IntN(n)
		j := rand.IntN(n - 1)
		if j >= i {
			j++
		}
		a, b := q.assigned[i], q.assigned[j]
		if b.inFlight < a.inFlight {
			return b
		}
		return a
	}
	var best *pod
	bestFree := 0
	for k := range n {
		p := q.assigned[(q.next+k)%n]
		if free := p.slots - p.inFlight; free > bestFree {
			best, bestFree = p, free
		}
	}
	if best != nil {
		q.next = (q.next + 1) % n
	}
	return best
}

// whyNoSlot says, for a deadline error, why no slot came. q.mu must be held.
func (q *queue) whyNoSlot() string {
	switch {
	case q.readyPods == 0:
		return "no pod of the target became ready"
	case len(q.assigned) == 0:
		return fmt.Sprintf("none of the target's %d ready pods is this activator's share", q.readyPods)
	default:
		return fmt.Sprintf("all %d pods this activator uses stayed at their concurrency limit (containerConcurrency %d)", len(q.assigned), q.cc)
	}
}

// assign recomputes which ready pods this activator uses and how many
// slots each. q.mu must be held.
func (q *queue) assign() {
	self := q.t.self
	activators := q.activators
	if _, found := slices.BinarySearch(activators, self); !found {
		// Not in the target's path (yet, or any more): traffic reaches us
		// only through endpoints not updated yet. Use every pod: holding
		// requests for lack of a share would fail them, and the overlap is
		// brief.
		activators = []string{self}
	}
	q.assigned = q.assigned[:0]
	q.readyPods = 0
	for _, p := range q.pods {
		p.slots = 0
		if !p.ready {
			continue
		}
		q.readyPods++
		if p.slots = share(q.cc, p.addr, activators, self); p.slots > 0 {
			q.assigned = append(q.assigned, p)
		}
	}
	slices.SortFunc(q.assigned, func(a, b *pod) int { return a.addr.Compare(b.addr) })
	if q.next >= len(q.assigned) {
		q.next = 0
	}
	q.m.readyPods.Set(float64(q.readyPods))
	q.m.assignedPods.Set(float64(len(q.assigned)))
}

// share is how many requests activator self (one of activators, which
// holds no duplicates) may have in flight at once to the pod at addr, for
// a containerConcurrency of cc (0: unlimited). Summed over the activators
// it is exactly cc for every pod, so activators that do not talk to each
// other never oversubscribe a pod.
//
// Each pod ranks the activators by a hash of (pod, activator) (rendezvous
// hashing) and deals its cc slots round the ranking: every activator gets
// cc/n, and the first cc mod n of the pod's ranking one more. cc = 10, 3
// activators: 4/3/3, the 4 going to the pod's first; cc = 1, 2 activators:
// the whole pod to its first.
//
// What an activator gets at a pod depends only on that pod and the
// activator set, never on the other pods. Activators see pods become ready
// at different moments (each probes them itself): a split by the pods'
// sorted order (the obvious reading; docs/autoscaling.md, "The activator
// in the path") moved shares between pods whenever one
// activator saw a pod the other did not yet, and a CC = 1 pod got two
// requests at once (1-7 per 100 cold-start requests in the e2e test with
// 2 activators).
//
// With fewer slots than activators at a pod (cc < n) whole slots would go
// by hash, and an activator could have none at any pod: at max-scale its
// requests would wait for good while the pods' slots sit with the others.
// The controller therefore puts at most cc activators in a target's path
// (decider.Activators), so that each has at least cc/n >= 1 slot at every
// pod. (An activator outside the path uses every pod: see assign.)
//
// cc = 0 has no limit to share: every activator balances over every pod.
func share(cc int, addr netip.AddrPort, activators []string, self string) int {
	n := len(activators)
	if cc == 0 {
		return unlimited
	}
	if n <= 1 {
		return cc
	}
	pod := podHash(addr)
	mine := rendezvous(pod, self)
	rank := 0
	for _, a := range activators {
		if h := rendezvous(pod, a); h > mine || (h == mine && a < self) {
			rank++
		}
	}
	slots := cc / n
	if rank < cc%n {
		slots++
	}
	return slots
}

// podHash and rendezvous make the (pod, activator) weights of share:
// FNV-1a over the pod's address and port, then the activator's name, with
// a final mix (splitmix64's) so that names differing in their last byte
// still rank independently.
func podHash(addr netip.AddrPort) uint64 {
	h := uint64(fnvOffset)
	b := addr.Addr().As16()
	for _, c := range b {
		h = (h ^ uint64(c)) * fnvPrime
	}
	h = (h ^ uint64(addr.Port()>>8)) * fnvPrime
	return (h ^ uint64(addr.Port()&0xff)) * fnvPrime
}

func rendezvous(pod uint64, activator string) uint64 {
	h := pod
	for i := range len(activator) {
		h = (h ^ uint64(activator[i])) * fnvPrime
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	return h ^ h>>31
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// ReadyPods is how many ready pods the target has now, as this activator
// knows them (0 for a target it does not know).
func (t *Throttler) ReadyPods(key target.Key) int {
	q := t.queue(key)
	if q == nil {
		return 0
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.readyPods
}
