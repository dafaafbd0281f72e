package recentload

import (
	"fmt"
	"hash/maphash"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unique"

	"k8s.io/utils/clock"

	"github.com/sockscale/sockscale/internal/stats"
)

// The bounds of a Store's window: a few report periods at least (the
// Knative panic window's 6 s), at most what a HorizontalPodAutoscaler's
// stabilization makes sense with.
const (
	MinWindow = 6 * time.Second
	MaxWindow = 10 * time.Minute
)

// latestMaxAge is how long a source's latest report speaks for "now"
// (TargetLoad.LatestConcurrency, WhenActive): two report periods, as the
// collector's StaleAfter; an older one is from a source that went quiet.
const latestMaxAge = 2 * time.Second

// shardCount is how many locks the pods are spread over: 5,000 agents'
// batches a second land on different shards and rarely wait for each
// other or for reads.
const shardCount = 64

// PodLoad is one pod's recent load, as its node's agent reported it.
type PodLoad struct {
	Namespace, Name string
	// IP and Node are the pod's address and the node whose agent
	// reported it: an agent speaks only for its own node's pods, so a
	// caller compares both with the pod object before it trusts the
	// values.
	IP   netip.Addr
	Node string
	// Workload is the Deployment the agent says the pod belongs to.
	Workload string
	// Concurrency is its average requests in flight, those proxied by
	// activators included; RPS its completed requests per second. Both
	// average the seconds of the window its reports covered.
	Concurrency, RPS float64
	// Heard is when its latest report arrived.
	Heard time.Time
}

// TargetLoad is one target's (Deployment's) recent load: its pods' and the
// activators' that hold or forward requests for it, each request counted
// once.
type TargetLoad struct {
	// Concurrency is the pods' average requests in flight without those
	// that came through an activator, plus the activators' average held or
	// forwarded: each request once, as the collector counts it. RPS is
	// likewise the pods' completions that did not come through an
	// activator plus the activators' arrivals, per second.
	Concurrency, RPS float64
	// ActivatorConcurrency is the activators' part of Concurrency: above
	// zero while a request waits for a target at zero pods.
	ActivatorConcurrency float64
	// LatestConcurrency is the sum of each source's latest report (of
	// those heard within the last 2 s), counted as Concurrency is: what is
	// in flight now, to within a report period.
	LatestConcurrency float64
	// Pods is how many pods were counted.
	Pods int
	// Heard is when the latest report counted arrived.
	Heard time.Time
}

// Store keeps the recent load of every pod the agents report and of every
// target the activators report, over a sliding window. It is safe for
// concurrent use: batches arrive on HTTP handlers while API requests
// read.
//
// # Timeline
//
// A report that arrives at t with period p covers [t-p, t) on the store's
// clock (not the reporter's, whose clock may be off). Each source (a pod;
// an activator for one target) keeps the window as buckets of a twelfth
// of it; a report's concurrency integral, requests and covered time go to
// the buckets it overlaps, in proportion. A read at now covers the 12
// complete buckets before the one now falls in, and that one so far: the
// window, and up to a twelfth more (a 60 s window read at 12:01:03 covers
// 12:00:00 to 12:01:03).
//
// # Averages
//
// A pod averages the seconds its reports covered, not the whole window:
// agents report every pod every second, so a pod not heard was not there
// (it started, or its agent was down). Example, a 60 s window: a pod that
// started 10 s ago, 4 requests in flight for 5 s then 2 for 5 s, 300
// requests completed, reads Concurrency (4x5 + 2x5)/10 = 3 and RPS
// 300/10 = 30, not 30/60 = 0.5 and 5.
//
// An activator reports a target only while it holds or forwards requests
// for it (and once more at zero), so its silence is zero load: its
// averages are over the whole time read (or the time since the store
// started, if shorter). Example, the same window read as a bucket ends
// (60 s exactly): two pods, each 5 in flight of which 1 came through an
// activator, and an activator that held 2 requests for 15 s of the 60 s:
// the target reads Concurrency 2x(5-1) + 2x15/60 = 8.5, of which
// ActivatorConcurrency 0.5.
//
// Entries not heard for a window and a bucket (what a read can still see)
// are dropped, every quarter window, by the Record call that finds it
// due.
//
// # Locking
//
// The pods are spread over shardCount shards by name, each with its own
// lock; targetsMu guards the targets map only, and each target's mu its
// members, activators and waiters. Lock order: a shard's mu, then
// targetsMu, then a target's mu; reads of a target copy its members under
// its mu and read each one under its shard's mu afterwards.
type Store struct {
	clock  clock.PassiveClock
	window time.Duration
	// width is a bucket's length, epoch the origin of the buckets'
	// timeline (the store's start), both in nanoseconds of the store's
	// clock.
	width int64
	epoch time.Time
	seed  maphash.Seed

	shards [shardCount]shard

	targetsMu sync.RWMutex
	targets   map[targetKey]*target

	// nextPrune is when the next Record call prunes, in nanoseconds since
	// epoch.
	nextPrune atomic.Int64

	// verify, if set, says whether a record from node for namespace/name
	// at ip is the pod's own (SetVerifier).
	verify func(namespace, name, node string, ip netip.Addr) bool
}

// SetVerifier makes the store ask verify before a record changes the node
// or the address a pod's history came from, and drop the record when
// verify says it is not the pod's: without it, an agent that claims
// another node's pod would reset that pod's history with every record
// and keep its value low. verify is asked only on such a change (a pod
// that moved, a name reused, or a lie), not for every record. Call it
// before the first Record.
func (s *Store) SetVerifier(verify func(namespace, name, node string, ip netip.Addr) bool) {
	s.verify = verify
}

// shard is a part of the pods. Padded to a cache line of its own, so that
// agents writing different shards do not slow each other down.
type shard struct {
	mu   sync.Mutex
	pods map[podKey]*pod
	// ipv6 holds the addresses of the pods whose address is IPv6 (pod.ip).
	ipv6 map[*pod]netip.Addr
	_    [64 - 24]byte
}

// addr returns p's address; the caller holds sh.mu.
func (sh *shard) addr(p *pod) netip.Addr {
	if p.ipv6 {
		return sh.ipv6[p]
	}
	return netip.AddrFrom4(p.ip)
}

// setAddr makes a p's address; the caller holds sh.mu.
func (sh *shard) setAddr(p *pod, a netip.Addr) {
	if a.Is4() {
		p.ip, p.ipv6 = a.As4(), false
		delete(sh.ipv6, p)
		return
	}
	if sh.ipv6 == nil {
		sh.ipv6 = make(map[*pod]netip.Addr)
	}
	p.ip, p.ipv6 = [4]byte{}, true
	sh.ipv6[p] = a
}

type podKey struct{ namespace, name string }

type targetKey struct{ namespace, workload string }

// pod is one pod's entry. Its namespace and workload are its target's,
// and its node a unique.Handle, which keeps the entry at 320 bytes (a Go
// size class), its 13 buckets included; with its name, its shard's map
// entry and its target's, a pod takes about 440 bytes (TestBytesPerPod):
// 220 MB for 500,000 pods.
type pod struct {
	// name is the entry's key with its target's namespace; it never
	// changes. Every other field is guarded by the shard's mu.
	name string
	// node is the reporting agent's node.
	node unique.Handle[string]
	// target is the target the pod belongs to (its Deployment); nil once
	// the entry is dropped.
	target *target
	series
	// ip is the pod's address (podaddr.Canonical) when it is IPv4. An
	// IPv6-only pod's is in its shard's ipv6 map instead, and ipv6 says
	// so: 12 more bytes in every entry would take it to the next size
	// class (352 bytes) for the few pods that need them.
	ip   [4]byte
	ipv6 bool
}

// target is one Deployment's members and activators.
type target struct {
	key targetKey
	// mu guards the fields below.
	mu sync.Mutex
	// pods are the pods whose latest record names this target, by name.
	pods map[string]*pod
	// activators are the activators' reports for the target, by the
	// activator's name (its batches' Node).
	activators map[string]*series
	// wake is closed when the target becomes active (WhenActive); nil
	// while nobody waits.
	wake chan struct{}
	// gone: pruned from the map; whoever finds it so looks the target up
	// again.
	gone bool
	// waiting is wake != nil, read without mu by Record calls, so that a
	// busy target nobody waits for costs no lock per record.
	waiting atomic.Bool
}

// New returns an empty store with a window of window on clk.
func New(clk clock.PassiveClock, window time.Duration) (*Store, error) {
	if window < MinWindow || window > MaxWindow {
		return nil, fmt.Errorf("recent load window %v: want %v to %v", window, MinWindow, MaxWindow)
	}
	s := &Store{clock: clk, window: window, width: int64(window / bucketsPerWindow), epoch: clk.Now(), seed: maphash.MakeSeed(),
		targets: make(map[targetKey]*target)}
	for i := range s.shards {
		s.shards[i].pods = make(map[podKey]*pod)
	}
	s.nextPrune.Store(int64(window))
	return s, nil
}

// Window is the length of time the averages cover.
func (s *Store) Window() time.Duration { return s.window }

// Len is how many pods and targets the store keeps.
func (s *Store) Len() (pods, targets int) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		pods += len(sh.pods)
		sh.mu.Unlock()
	}
	s.targetsMu.RLock()
	defer s.targetsMu.RUnlock()
	return pods, len(s.targets)
}

// RecordPods adds an agent's batch, the records of every pod it counts
// (autoscaled or not). node is the agent's node as the caller
// authenticated it. A pod whose record names another node, address or
// workload than its previous one starts a new history: a pod name reused
// by a new pod (a StatefulSet's) does not inherit the old one's load. An
// agent that lies about another node's pod could so cut the honest
// history short with every record; with a verifier (SetVerifier) its
// records are dropped instead.
func (s *Store) RecordPods(node string, b *stats.Batch) {
	if b.Period <= 0 {
		return
	}
	to, from, period := s.covered(b.Period)
	for i := range b.Pods {
		r := &b.Pods[i]
		if !r.IP.IsValid() {
			continue // stats.Decode gives none such; a caller's bug
		}
		rep := report{concurrency: r.Concurrency, proxiedConcurrency: r.ProxiedConcurrency,
			requests: float64(r.Requests), proxiedRequests: float64(r.ProxiedRequests)}
		t := s.recordPod(node, r, from, to, period, rep)
		if t != nil && rep.active() && t.waiting.Load() {
			t.release()
		}
	}
	s.maybePrune(to)
}

// covered is where a report of period p arriving now lies on the
// timeline: it ends at to and covers from, at most a window before.
func (s *Store) covered(p time.Duration) (to, from, period int64) {
	to = int64(s.clock.Now().Sub(s.epoch))
	return to, to - int64(min(p, s.window)), int64(p)
}

// recordPod adds one pod record and returns the pod's target; nil when
// the verifier refused the record.
func (s *Store) recordPod(node string, r *stats.PodStat, from, to, period int64, rep report) *target {
	sh := s.shard(r.Pod)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	p := sh.pods[podKey{r.Namespace, r.Pod}]
	if p != nil && (p.node.Value() != node || sh.addr(p) != r.IP) && s.verify != nil && !s.verify(r.Namespace, r.Pod, node, r.IP) {
		return nil // another node's claim on a pod that has a history: not the pod's own
	}
	switch {
	case p == nil:
		p = &pod{name: r.Pod, node: unique.Make(node), series: newSeries()}
		sh.setAddr(p, r.IP)
		sh.pods[podKey{intern(r.Namespace), r.Pod}] = p
		s.join(p, r.Namespace, r.Workload)
	case p.target.key.workload != r.Workload:
		p.target.leave(p)
		s.join(p, r.Namespace, r.Workload)
		p.reset()
	}
	if p.node.Value() != node || sh.addr(p) != r.IP {
		p.node = unique.Make(node)
		sh.setAddr(p, r.IP)
		p.reset()
	}
	p.record(from, to, period, s.width, rep)
	return p.target
}

// join makes p a member of the target of namespace/workload.
func (s *Store) join(p *pod, namespace, workload string) {
	t := s.lockedTarget(namespace, workload)
	t.pods[p.name] = p
	p.target = t
	t.mu.Unlock()
}

// leave drops p from t's members.
func (t *target) leave(p *pod) {
	t.mu.Lock()
	if t.pods[p.name] == p {
		delete(t.pods, p.name)
	}
	t.mu.Unlock()
	p.target = nil
}

// RecordTargets adds an activator's batch: for each target, the requests
// it held or forwarded (b.Node names the activator).
func (s *Store) RecordTargets(b *stats.Batch) {
	if b.Period <= 0 {
		return
	}
	to, from, period := s.covered(b.Period)
	for i := range b.Targets {
		r := &b.Targets[i]
		rep := report{concurrency: r.Concurrency, requests: float64(r.Requests)}
		t := s.recordActivator(b.Node, r.Namespace, r.Workload, from, to, period, rep)
		if rep.active() && t.waiting.Load() {
			t.release()
		}
	}
	s.maybePrune(to)
}

// recordActivator adds one activator's report of a target and returns the
// target.
func (s *Store) recordActivator(activator, namespace, workload string, from, to, period int64, rep report) *target {
	t := s.lockedTarget(namespace, workload)
	a := t.activators[activator]
	if a == nil {
		n := newSeries()
		a = &n
		t.activators[intern(activator)] = a
	}
	a.record(from, to, period, s.width, rep)
	t.mu.Unlock()
	return t
}

// Pod returns a pod's load at now, false if it was not heard within the
// window.
func (s *Store) Pod(namespace, name string) (PodLoad, bool) {
	now := s.clock.Now()
	sh := s.shard(name)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	p := sh.pods[podKey{namespace, name}]
	if p == nil {
		return PodLoad{}, false
	}
	l, ok := s.podLoad(sh, p, now)
	return l.PodLoad, ok
}

// podLoadAt is a pod's load with what a target counts of it.
type podLoadAt struct {
	PodLoad
	// ownConcurrency and ownRPS leave out what came through activators;
	// latest is its latest report's own concurrency, fresh whether that
	// report is recent enough to speak for now.
	ownConcurrency, ownRPS float64
	latest                 float64
	fresh, latestActive    bool
}

// podLoad reads p at now; the caller holds p's shard sh's mu.
func (s *Store) podLoad(sh *shard, p *pod, now time.Time) (podLoadAt, bool) {
	sum := p.sum(s.bucketOf(now))
	if sum.heard <= 0 || p.target == nil {
		return podLoadAt{}, false
	}
	heard := float64(sum.heard)
	l := podLoadAt{
		PodLoad: PodLoad{Namespace: p.target.key.namespace, Name: p.name, IP: sh.addr(p), Node: p.node.Value(),
			Workload: p.target.key.workload, Concurrency: float64(sum.concurrency) / heard, RPS: float64(sum.requests) / heard,
			Heard: s.epoch.Add(time.Duration(p.heard))},
		ownConcurrency: max(0, float64(sum.concurrency-sum.proxiedConcurrency)) / heard,
		ownRPS:         max(0, float64(sum.requests-sum.proxiedRequests)) / heard,
		latest:         float64(p.latest),
		latestActive:   p.latestActive,
	}
	l.fresh = now.Sub(l.Heard) <= latestMaxAge
	return l, true
}

// Target returns a target's load at now, false if no source of it was
// heard within the window. keep, if not nil, says which pods to count:
// the caller drops the records it cannot verify.
func (s *Store) Target(namespace, workload string, keep func(PodLoad) bool) (TargetLoad, bool) {
	now := s.clock.Now()
	t := s.target(namespace, workload, false)
	if t == nil {
		return TargetLoad{}, false
	}
	var load TargetLoad
	heard := false
	t.mu.Lock()
	members := make([]*pod, 0, len(t.pods))
	for _, p := range t.pods {
		members = append(members, p)
	}
	n, span := s.bucketOf(now), s.span(now)
	for _, a := range t.activators {
		sum := a.sum(n)
		if sum.heard <= 0 {
			continue
		}
		heard = true
		// Silence is zero: average over the window read, or over what
		// the activator covered if that is longer (overlapping reports).
		seconds := max(span, float64(sum.heard))
		load.ActivatorConcurrency += float64(sum.concurrency) / seconds
		load.RPS += float64(sum.requests) / seconds
		at := s.epoch.Add(time.Duration(a.heard))
		if now.Sub(at) <= latestMaxAge {
			load.LatestConcurrency += float64(a.latest)
		}
		load.Heard = later(load.Heard, at)
	}
	t.mu.Unlock()
	load.Concurrency = load.ActivatorConcurrency

	for _, p := range members {
		sh := s.shard(p.name)
		sh.mu.Lock()
		var l podLoadAt
		ok := p.target == t // else it left meanwhile
		if ok {
			l, ok = s.podLoad(sh, p, now)
		}
		sh.mu.Unlock()
		if !ok || (keep != nil && !keep(l.PodLoad)) {
			continue
		}
		heard = true
		load.Pods++
		load.Concurrency += l.ownConcurrency
		load.RPS += l.ownRPS
		if l.fresh {
			load.LatestConcurrency += l.latest
		}
		load.Heard = later(load.Heard, l.Heard)
	}
	return load, heard
}

// WhenActive returns a channel closed as soon as the target has requests
// in flight or held: at once if a source's latest report (within the
// last 2 s) says so, else by the first Record call with such a record
// (Concurrency or Requests above zero). Every waiter of a target shares
// one channel, so waiting costs no goroutine, and nothing per waiter; the
// channel stays with its target until it is closed.
func (s *Store) WhenActive(namespace, workload string) <-chan struct{} {
	t := s.lockedTarget(namespace, workload)
	if t.wake == nil {
		t.wake = make(chan struct{})
	}
	wake := t.wake
	// Set before looking at the sources: a record made active after the
	// look sees it and releases (Record sets latest, then reads waiting).
	t.waiting.Store(true)
	t.mu.Unlock()
	if s.activeNow(t) {
		t.release()
	}
	return wake
}

// lockedTarget returns the target of namespace/workload, made if there is
// none, with its mu held; never one that pruning took out of the map.
func (s *Store) lockedTarget(namespace, workload string) *target {
	for {
		t := s.target(namespace, workload, true)
		t.mu.Lock()
		if !t.gone {
			return t
		}
		t.mu.Unlock()
	}
}

// activeNow says whether a source of t reported requests within the last
// 2 s in its latest report.
func (s *Store) activeNow(t *target) bool {
	now := s.clock.Now()
	t.mu.Lock()
	members := make([]*pod, 0, len(t.pods))
	for _, p := range t.pods {
		members = append(members, p)
	}
	for _, a := range t.activators {
		if a.latestActive && now.Sub(s.epoch.Add(time.Duration(a.heard))) <= latestMaxAge {
			t.mu.Unlock()
			return true
		}
	}
	t.mu.Unlock()
	for _, p := range members {
		sh := s.shard(p.name)
		sh.mu.Lock()
		active := p.target == t && p.latestActive && now.Sub(s.epoch.Add(time.Duration(p.heard))) <= latestMaxAge
		sh.mu.Unlock()
		if active {
			return true
		}
	}
	return false
}

// release closes the target's wake channel, if anyone waits.
func (t *target) release() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.wake != nil {
		close(t.wake)
		t.wake = nil
	}
	t.waiting.Store(false)
}

// target returns the target of namespace/workload, made if create and
// there is none (else nil).
func (s *Store) target(namespace, workload string, create bool) *target {
	s.targetsMu.RLock()
	t := s.targets[targetKey{namespace, workload}]
	s.targetsMu.RUnlock()
	if t != nil || !create {
		return t
	}
	s.targetsMu.Lock()
	defer s.targetsMu.Unlock()
	if t = s.targets[targetKey{namespace, workload}]; t == nil {
		key := targetKey{intern(namespace), intern(workload)}
		t = &target{key: key, pods: make(map[string]*pod), activators: make(map[string]*series)}
		s.targets[key] = t
	}
	return t
}

func (s *Store) shard(name string) *shard {
	return &s.shards[maphash.String(s.seed, name)%shardCount]
}

// bucketOf is the index of the bucket t falls in.
func (s *Store) bucketOf(t time.Time) int64 {
	return floorDiv(int64(t.Sub(s.epoch)), s.width)
}

// span is how many seconds a read at now covers: from the start of the
// oldest of its 13 buckets, or from the store's start if that is later.
func (s *Store) span(now time.Time) float64 {
	rel := int64(now.Sub(s.epoch))
	oldest := (floorDiv(rel, s.width) - ringLength + 1) * s.width
	return float64(rel-max(oldest, 0)) / 1e9
}

// maybePrune prunes if it is due at now (nanoseconds since epoch); one
// caller does it, the others go on.
func (s *Store) maybePrune(now int64) {
	next := s.nextPrune.Load()
	if now < next || !s.nextPrune.CompareAndSwap(next, now+int64(s.window/4)) {
		return
	}
	s.prune(now)
}

// prune drops the pods and activators not heard for a window and a
// bucket, then the targets left with neither and nobody waiting for them.
// Each shard's lock is held for its own sweep only.
func (s *Store) prune(now int64) {
	stale := now - int64(s.window) - s.width
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for key, p := range sh.pods {
			if p.heard < stale {
				delete(sh.pods, key)
				delete(sh.ipv6, p)
				p.target.leave(p)
			}
		}
		sh.mu.Unlock()
	}
	s.targetsMu.Lock()
	defer s.targetsMu.Unlock()
	for key, t := range s.targets {
		t.mu.Lock()
		for name, a := range t.activators {
			if a.heard < stale {
				delete(t.activators, name)
			}
		}
		if len(t.pods) == 0 && len(t.activators) == 0 && t.wake == nil {
			t.gone = true
			delete(s.targets, key)
		}
		t.mu.Unlock()
	}
}

// intern returns the canonical copy of s: namespaces, Deployments and
// nodes are named by thousands of pods, which then share one copy
// instead of each keeping the one its first batch decoded. (Once no
// unique.Handle is left, a later call makes a new copy: less sharing,
// never a wrong name.)
func intern(s string) string { return unique.Make(s).Value() }

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
