package kpa

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/go-logr/logr"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/decider"
	"github.com/sockscale/sockscale/controller/internal/endpoints"
)

// targetState is what a PodAutoscaler's ticks carry over.
type targetState struct {
	decider *decider.Decider
	// collected is the collector's key: the target's name.
	collected collector.Key
	// lastDesired is the last decided count (a poke wakes targets at 0).
	lastDesired int32
	zero        zeroState
	// decidedAt is the wall time of the latest decision (for the
	// decision-interval metric).
	decidedAt time.Time
	// messagesAt is when the status last got its conditions' messages of
	// the moment (settle).
	messagesAt time.Time
	// accounting is the status.accounting of the last tick applied ("":
	// none yet, the PodAutoscaler's status says): what a transition to
	// Connections is announced against, whatever the status writers have
	// written so far.
	accounting v1alpha1.Accounting
}

// sinceDecided returns the time since the previous decision (0 before the
// first) and makes now the latest.
func (t *targetState) sinceDecided(now time.Time) time.Duration {
	var d time.Duration
	if !t.decidedAt.IsZero() {
		d = now.Sub(t.decidedAt)
	}
	t.decidedAt = now
	return d
}

// outcome is one tick: the decision, the count it leads to, and what the
// target's ServerlessService reports.
type outcome struct {
	dec         decider.Decision
	values      collector.Values
	current     int32 // the target's replicas before this tick
	want        int32 // after bounds and the scale-to-zero rules
	ready       int32
	initialized bool
	reach       reach
	zero        zeroOutcome
	sks         *v1alpha1.ServerlessService
	// hpa is the HPA class's HorizontalPodAutoscaler (nil: the KPA).
	hpa *autoscalingv2.HorizontalPodAutoscaler

	// accounting is the status.accounting this tick shows, and
	// lastAccounting the one shown before.
	accounting, lastAccounting v1alpha1.Accounting
}

// decide runs the target's decider on the collector's windows, bounds the
// result, writes the wanted mode to the ServerlessService and applies the
// scale-to-zero rules.
func (r *PodAutoscaler) decide(ctx context.Context, key collector.Key, pa *v1alpha1.PodAutoscaler, tgt *target, settings config.Settings, now time.Time, status *v1alpha1.PodAutoscalerStatus) (outcome, error) {
	// The collector keys targets by their name, as agents report pods
	// (by their workload: the owner's name, a Deployment's for its
	// ReplicaSets' pods).
	tkey := collector.Key{Namespace: pa.Namespace, Name: tgt.name}
	o := outcome{ready: tgt.ready, current: tgt.replicas}
	d := r.decider(key, tkey, settings, o.ready, now)
	o.values = r.values(ctx, tkey, now)
	if o.lastAccounting = r.state(key).accounting; o.lastAccounting == "" {
		o.lastAccounting = status.Accounting
	}
	o.accounting = accountingOf(o.lastAccounting, o.values.Accounting)
	o.reach = r.reachable(ctx, pa, tgt)
	o.dec = d.Decide(now, decider.Inputs{ReadyPods: o.ready, Stable: o.values.Stable, Panic: o.values.Panic, HasData: o.values.HasData, Reachable: o.reach.ok})
	o.initialized = meta.IsStatusConditionTrue(status.Conditions, ConditionInitialized) || o.ready >= settings.InitialScale
	hpaClass := settings.Class == config.ClassHPA
	var want int32
	var err error
	switch settings.Class {
	case config.ClassHPA:
		// The HPA owns the counts from 1 up (hpaWish); the decider here
		// only says when the target is idle, and shows its values.
		if o.hpa, err = r.ensureHPA(ctx, pa, makeHPA(pa, settings)); err != nil {
			return outcome{}, err
		}
		o.dec.Panicking = false
		want = hpaWish(o.dec, o.values.Stable == 0, settings, o.current, o.initialized, o.reach.ok)
	case config.ClassExternal:
		return r.decideExternal(ctx, pa, tgt, o)
	default:
		if err := r.removeHPA(ctx, pa); err != nil {
			return outcome{}, err
		}
		want = bounded(o.dec, settings, o.current, o.initialized, o.reach.ok)
	}
	// The mode follows the decision (docs/autoscaling.md, "Serve or Proxy":
	// Serve iff pods are wanted, their burst capacity is covered and they
	// have no containerConcurrency); the zero rules below may still hold
	// the last pod while the activator takes over.
	mode, why := endpoints.Wanted(want, o.dec.ExcessBurstCapacity, settings.ContainerConcurrency)
	if o.sks, err = r.ensureSKS(ctx, pa, tgt, mode, why, o.dec.Activators); err != nil {
		return outcome{}, err
	}
	o.zero = r.state(key).zero.apply(zeroInputs{
		now: now, want: want, current: o.current, ready: o.ready, mode: o.sks.Status.Mode, s: settings,
		reachable: o.reach.ok, noPath: o.reach.noPath,
		progressDeadline: tgt.progressDeadline,
		activatorInPath:  func() bool { return r.activatorInPath(ctx, pa.Namespace, pa.Spec.Service) },
	})
	o.want = o.zero.pods
	if hpaClass && want == 0 && o.want > 0 {
		// On the way to zero the rules hold a pod; the HPA's count
		// stands instead until the last pods go together.
		o.want = o.current
	}
	return o, nil
}

// values are the collector's windows of a target. The collect reconciler
// alone tells the collector which targets to watch (it runs on every
// replica, and sees a PodAutoscaler as soon as this one does or sooner);
// until it has, the target has no data, and the decider holds the scale
// as at any cold start.
func (r *PodAutoscaler) values(ctx context.Context, collected collector.Key, now time.Time) collector.Values {
	v, err := r.Collector.Values(collected, now) // its only error: not watched
	if err != nil {
		log.FromContext(ctx).V(1).Info("no windows yet; no data", "reason", err.Error())
		return collector.Values{}
	}
	return v
}

// deciderLog is every decider's logger, made on first use (after main
// has set the logger); r.mu is held.
func (r *PodAutoscaler) deciderLog() logr.Logger {
	if r.decisionLog.GetSink() == nil {
		r.decisionLog = log.Log.WithName("decider")
	}
	return r.decisionLog
}

// decider returns the PodAutoscaler's decider, made on its first tick (a
// busy target starts in panic, see decider.New).
func (r *PodAutoscaler) decider(key, collected collector.Key, s config.Settings, ready int32, now time.Time) *decider.Decider {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.targets == nil {
		r.targets = make(map[collector.Key]*targetState)
	}
	t, ok := r.targets[key]
	if !ok {
		t = &targetState{decider: decider.New(s, ready, now, r.deciderLog(), key.String()), lastDesired: -1}
		r.targets[key] = t
		if r.Buckets != nil {
			// Its bucket was just won (or the target is new): what the
			// windows kept from before is old, and the records went to
			// another replica since; they start afresh, so that the
			// decision holds until this replica's first reports. (A
			// target not watched yet has nothing to drop.)
			r.Collector.Restart(collected)
		}
	}
	if t.collected != collected {
		// The PodAutoscaler now points elsewhere: the collect reconciler
		// moves the windows' registration, this only Poke's index.
		if t.lastDesired == 0 {
			r.unmarkZero(t.collected, key)
			r.markZero(collected, key)
		}
	}
	t.collected = collected
	t.decider.Update(s)
	return t.decider
}

// state is the PodAutoscaler's carried state (made by decider).
func (r *PodAutoscaler) state(key collector.Key) *targetState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.targets[key]
}

// forget drops a deleted (or no longer owned) PodAutoscaler's state. The
// collector's windows stay: the collect reconciler registered them and
// forgets them when the PodAutoscaler goes; a bucket given away keeps
// them warm on this replica, as on every standby.
func (r *PodAutoscaler) forget(key collector.Key) {
	r.pokedAt.Delete(key)
	r.schedules.Delete(key)
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.targets[key]; ok {
		if t.lastDesired == 0 {
			r.unmarkZero(t.collected, key)
		}
		delete(r.targets, key)
	}
}

// markZero adds PodAutoscaler pa, last decided at zero, to
// atZero[collected]; r.mu is held.
func (r *PodAutoscaler) markZero(collected, pa collector.Key) {
	if r.atZero == nil {
		r.atZero = make(map[collector.Key]map[collector.Key]struct{})
	}
	if r.atZero[collected] == nil {
		r.atZero[collected] = make(map[collector.Key]struct{}, 1)
	}
	if _, ok := r.atZero[collected][pa]; !ok {
		r.atZero[collected][pa] = struct{}{}
		r.publishZeros()
	}
}

// unmarkZero drops PodAutoscaler pa from atZero[collected]; r.mu is
// held.
func (r *PodAutoscaler) unmarkZero(collected, pa collector.Key) {
	pas := r.atZero[collected]
	if _, ok := pas[pa]; !ok {
		return
	}
	delete(pas, pa)
	if len(pas) == 0 {
		delete(r.atZero, collected)
	}
	r.publishZeros()
}

// publishZeros copies atZero for Poke; r.mu is held.
func (r *PodAutoscaler) publishZeros() {
	idx := make(map[collector.Key][]collector.Key, len(r.atZero))
	for collected, pas := range r.atZero {
		idx[collected] = slices.Collect(maps.Keys(pas))
	}
	r.zeroIndex.Store(&idx)
}

// setLastDesired records the count a valid decision led to and keeps
// atZero, Poke's index, in step (under r.mu).
func (r *PodAutoscaler) setLastDesired(key collector.Key, want int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.targets[key]; ok {
		switch {
		case want == 0 && t.lastDesired != 0:
			r.markZero(t.collected, key)
		case want != 0 && t.lastDesired == 0:
			r.unmarkZero(t.collected, key)
		}
		t.lastDesired = want
	}
}
