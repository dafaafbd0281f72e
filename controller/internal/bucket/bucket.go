package bucket

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/sockscale/sockscale/internal/stats"
)

// MaxCount bounds --buckets: every replica renews a Lease per bucket it
// holds every RetryPeriod, and the held set is one 64-bit word.
const MaxCount = stats.MaxBuckets

// Of is the bucket of a target among count: stats.BucketOf its
// namespace and the name of what it scales (the Deployment), which is
// what the agents' records name, so that they can be routed to the
// bucket's holder. It is fixed for the target's life, so moving a bucket
// moves whole targets; PodAutoscalers that scale one Deployment share a
// bucket, as they share its windows.
func Of(namespace, target string, count int) int { return stats.BucketOf(namespace, target, count) }

// LeaseName is bucket i's Lease among count.
func LeaseName(i, count int) string {
	return fmt.Sprintf("sockscale-controller-bucket-%d-of-%d", i, count)
}

// Default timing of the elections, as controller-runtime's for its
// leader: a holder that stops renewing loses a bucket within
// RenewDeadline and another may take it after LeaseDuration; one that
// stops gracefully (or gives a bucket away) releases it at once.
const (
	LeaseDuration = 15 * time.Second
	RenewDeadline = 10 * time.Second
	RetryPeriod   = 2 * time.Second
)

// Options configures a Set.
type Options struct {
	// Count is the number of buckets, 2..MaxCount.
	Count int
	// Namespace holds the Leases; Identity names this replica in them
	// (its pod's name).
	Namespace, Identity string
	Leases              coordinationv1.LeasesGetter
	Log                 logr.Logger
	// Registerer, if set, gets the bucket metrics.
	Registerer prometheus.Registerer
	// LeaseDuration, RenewDeadline and RetryPeriod: 0 for the defaults
	// above (tests shorten them).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Clock: nil for the real one.
	Clock clock.WithTicker
}

// Set is the buckets this replica holds, and the elections that win and
// balance them. Every replica announces itself in a member Lease and
// runs a balancer that, every RetryPeriod, reads the Leases and bids for
// the buckets assigned to it (spread evenly over the live replicas, see
// assign); it gives away, releasing the Lease, a bucket assigned to
// another live replica. A target is this replica's to decide only while
// Owns says so: a bucket stops being owned before its Lease is released
// (and, given away, only once the work that entered it has left: Enter)
// or can have expired (RenewDeadline < LeaseDuration), so no target is
// scaled by two replicas at once.
//
// A nil *Set owns every target: one replica (the leader) decides them
// all.
type Set struct {
	opts  Options
	held  atomic.Uint64 // bit i: bucket i is held
	clock clock.WithTicker
	// inFlight[i] counts the work on bucket i's targets between Enter
	// and its leave: a bucket given away keeps its Lease until it is 0.
	inFlight [MaxCount]atomic.Int64

	heldGauge *prometheus.GaugeVec
	members   prometheus.Gauge

	mu sync.Mutex
	// bids[i] is the running election of bucket i, nil when this
	// replica does not bid for it; term[i] counts the elections of
	// bucket i, so that a late start of an election given up already
	// does not mark the bucket held.
	bids   [MaxCount]*bid
	term   [MaxCount]uint64
	gained []chan struct{}
	// seen is the local time each Lease was last seen changing (by
	// resourceVersion): liveness is judged on this clock alone, whatever
	// the other replicas' clocks say.
	seen map[string]seenLease
}

type bid struct {
	cancel context.CancelFunc
	done   chan struct{}
}

type seenLease struct {
	version string
	at      time.Time
}

// New checks opts; Start runs the elections.
func New(opts Options) (*Set, error) {
	if opts.Count < 2 || opts.Count > MaxCount {
		return nil, fmt.Errorf("buckets %d: want 2..%d (1: no buckets, one leader decides every target)", opts.Count, MaxCount)
	}
	if opts.Namespace == "" || opts.Identity == "" || opts.Leases == nil {
		return nil, errors.New("buckets: a namespace for the Leases, this replica's identity and a Lease client are needed")
	}
	opts.LeaseDuration = orDefault(opts.LeaseDuration, LeaseDuration)
	opts.RenewDeadline = orDefault(opts.RenewDeadline, RenewDeadline)
	opts.RetryPeriod = orDefault(opts.RetryPeriod, RetryPeriod)
	s := &Set{opts: opts, clock: opts.Clock, seen: map[string]seenLease{}}
	if s.clock == nil {
		s.clock = clock.RealClock{}
	}
	if opts.Registerer != nil {
		s.heldGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sockscale_controller_bucket_held",
			Help: "1 for each bucket of targets this replica holds (decides), 0 for the others; label bucket is 0..N-1 of --buckets=N.",
		}, []string{"bucket"})
		s.members = prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sockscale_controller_bucket_members",
			Help: "Controller replicas this one sees alive (their member Leases renewed), itself included: the buckets are spread over them.",
		})
		if err := errors.Join(opts.Registerer.Register(s.heldGauge), opts.Registerer.Register(s.members)); err != nil {
			return nil, fmt.Errorf("register bucket metrics: %w", err)
		}
		for i := range opts.Count {
			s.heldGauge.WithLabelValues(fmt.Sprint(i)).Set(0)
		}
	}
	return s, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// Count is the number of buckets (1 for a nil Set).
func (s *Set) Count() int {
	if s == nil {
		return 1
	}
	return s.opts.Count
}

// Owns tells whether the target namespace/target (the Deployment) is
// this replica's to decide now. It is cheap (a hash and an atomic load):
// pokes and every enqueue ask it.
func (s *Set) Owns(namespace, target string) bool {
	if s == nil {
		return true
	}
	return s.Holds(Of(namespace, target, s.opts.Count))
}

// Enter tells whether the target namespace/target is this replica's now
// and, if it is, holds its bucket here until leave is called: a bucket
// given away meanwhile is not owned any more (Owns says no, Enter too),
// but its Lease is released only once every holder has left, so that
// the replica taking it over never writes for a target while this one
// still does. Work that writes for a target (a reconcile) runs between
// Enter and leave; it should be short, as a handover waits for it (at
// most RenewDeadline). A nil Set owns everything.
func (s *Set) Enter(namespace, target string) (leave func(), ok bool) {
	if s == nil {
		return func() {}, true
	}
	i := Of(namespace, target, s.opts.Count)
	// Counted first, checked second; stopBid clears first and waits
	// second: either the give-away sees this count, or this sees the
	// bucket gone.
	s.inFlight[i].Add(1)
	if !s.Holds(i) {
		s.inFlight[i].Add(-1)
		return nil, false
	}
	return func() { s.inFlight[i].Add(-1) }, true
}

// Header is this replica's stats.HeaderBuckets value, or "" for a nil
// Set (every record is for it).
func (s *Set) Header() string {
	if s == nil {
		return ""
	}
	return stats.Buckets{Count: s.opts.Count, Held: s.held.Load()}.String()
}

// Holds tells whether bucket i is held.
func (s *Set) Holds(i int) bool {
	if s == nil {
		return true
	}
	return s.held.Load()&(1<<uint(i)) != 0
}

// Held lists the buckets held, in order.
func (s *Set) Held() []int {
	var out []int
	for i := range s.Count() {
		if s.Holds(i) {
			out = append(out, i)
		}
	}
	return out
}

// Gained returns a channel that is signalled when this replica wins a
// bucket, after Owns says so: the bucket's targets must be looked at now,
// as no event may come for them for a long while. Signals coalesce (one
// pending at most), so the receiver looks at every target it owns. Call
// it before Start.
func (s *Set) Gained() <-chan struct{} {
	c := make(chan struct{}, 1)
	if s == nil {
		return c
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gained = append(s.gained, c)
	return c
}

// NeedLeaderElection is false: every replica competes for buckets,
// leader of the rest or not (manager.LeaderElectionRunnable).
func (s *Set) NeedLeaderElection() bool { return false }

// Start balances and runs the elections until ctx ends; then it stops
// owning every bucket, releases their Leases and its member Lease, so
// that the other replicas take them at once (manager.Runnable).
func (s *Set) Start(ctx context.Context) error {
	tick := s.clock.NewTicker(s.opts.RetryPeriod)
	defer tick.Stop()
	for {
		if err := s.balance(ctx); err != nil && ctx.Err() == nil {
			// The bids stay as they are: a replica that cannot read
			// the Leases cannot renew them either, and loses its
			// buckets by their deadline.
			s.opts.Log.Error(err, "balance buckets")
		}
		select {
		case <-ctx.Done():
			s.stopAll()
			return nil
		case <-tick.C():
		}
	}
}

// elect runs bucket i's election until the bid is cancelled (given away
// or stopping) or the bucket is lost, then ends the bid.
func (s *Set) elect(ctx context.Context, i int, term uint64, b *bid) {
	defer close(b.done)
	defer s.endBid(i, b)
	log := s.opts.Log.WithValues("bucket", i, "of", s.opts.Count)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: s.opts.Namespace, Name: LeaseName(i, s.opts.Count)},
			Client:     s.opts.Leases,
			LockConfig: resourcelock.ResourceLockConfig{Identity: s.opts.Identity},
		},
		Name:          LeaseName(i, s.opts.Count),
		LeaseDuration: s.opts.LeaseDuration, RenewDeadline: s.opts.RenewDeadline, RetryPeriod: s.opts.RetryPeriod,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				if s.setHeld(i, term, true) {
					log.Info("bucket won: deciding its targets")
					s.announce()
				}
			},
			OnStoppedLeading: func() {
				if s.setHeld(i, term, false) {
					log.Info("bucket lost: its targets are left to the replica that takes it")
				}
			},
		},
	})
	if err != nil { // only a bad timing, which New rules out
		log.Error(err, "bucket election not started")
		return
	}
	le.Run(ctx) // returns when the bucket is lost or ctx ends
}

// setHeld marks bucket i held or not for the election of term; it
// reports whether that changed anything. An election given up already
// (a newer term) changes nothing.
func (s *Set) setHeld(i int, term uint64, held bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.term[i] != term {
		return false
	}
	return s.mark(i, held)
}

// mark sets bit i; s.mu is held.
func (s *Set) mark(i int, held bool) bool {
	old := s.held.Load()
	next := old &^ (1 << uint(i))
	if held {
		next |= 1 << uint(i)
	}
	s.held.Store(next) // the only writer is under s.mu
	if s.heldGauge != nil {
		v := 0.0
		if held {
			v = 1
		}
		s.heldGauge.WithLabelValues(fmt.Sprint(i)).Set(v)
	}
	return old != next
}

// startBid starts an election for bucket i unless one runs; s.mu is held.
func (s *Set) startBid(ctx context.Context, i int) {
	if s.bids[i] != nil {
		return
	}
	s.term[i]++
	bctx, cancel := context.WithCancel(ctx)
	b := &bid{cancel: cancel, done: make(chan struct{})}
	s.bids[i] = b
	go s.elect(bctx, i, s.term[i], b)
}

// stopBid gives bucket i up: it is not owned from this moment; once the
// work that entered it has left (see Enter), its election ends and
// releases the Lease. s.mu is held; the wait is not.
func (s *Set) stopBid(i int) *bid {
	b := s.bids[i]
	if b == nil {
		return nil
	}
	s.term[i]++ // a late OnStartedLeading of this election marks nothing
	s.mark(i, false)
	go func() {
		s.drain(i)
		b.cancel()
	}()
	return b
}

// drainPoll is how often a bucket given away looks for its work to end.
const drainPoll = 5 * time.Millisecond

// drain waits until no work holds bucket i (Enter), at most RenewDeadline:
// the Lease is still renewed meanwhile, so nobody else takes the bucket.
// Work still in after that is logged and left to overlap.
func (s *Set) drain(i int) {
	deadline := s.clock.Now().Add(s.opts.RenewDeadline)
	for s.inFlight[i].Load() > 0 {
		if !s.clock.Now().Before(deadline) {
			s.opts.Log.Info("bucket handed over with work still in it", "bucket", i, "of", s.opts.Count, "inFlight", s.inFlight[i].Load(), "waited", s.opts.RenewDeadline)
			return
		}
		<-s.clock.After(drainPoll)
	}
}

// endBid forgets bid b of bucket i when its election ends (a lost
// bucket is bid for again by the next balance).
func (s *Set) endBid(i int, b *bid) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bids[i] == b {
		s.bids[i] = nil
		s.term[i]++
		s.mark(i, false)
	}
}

// stopAll gives every bucket up and waits for their Leases' release.
func (s *Set) stopAll() {
	s.mu.Lock()
	var stopping []*bid
	for i := range s.opts.Count {
		if b := s.stopBid(i); b != nil {
			stopping = append(stopping, b)
		}
	}
	s.mu.Unlock()
	for _, b := range stopping {
		<-b.done
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.RenewDeadline)
	defer cancel()
	if err := s.leaveMembers(ctx); err != nil {
		s.opts.Log.Error(err, "delete member Lease (the others notice when it expires)")
	}
}

// announce signals every Gained channel; a full one has a signal
// pending already.
func (s *Set) announce() {
	s.mu.Lock()
	chans := slices.Clone(s.gained)
	s.mu.Unlock()
	for _, c := range chans {
		select {
		case c <- struct{}{}:
		default:
		}
	}
}

// Resync is a controller-runtime source that, each time a bucket is won,
// queues the keys list returns: the objects of the targets this replica
// owns now. A nil Set never signals.
func (s *Set) Resync(list func(ctx context.Context) ([]types.NamespacedName, error), log logr.Logger) source.Source {
	gained := s.Gained()
	return source.Func(func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-gained:
				}
				keys, err := list(ctx)
				if err != nil {
					// Each target's own events and ticks still come;
					// only the quick start of a won bucket is lost.
					log.Error(err, "list the targets of a won bucket")
					continue
				}
				for _, k := range keys {
					q.Add(reconcile.Request{NamespacedName: k})
				}
			}
		}()
		return nil
	})
}
