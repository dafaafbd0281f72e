package kpa

import (
	"context"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
)

// Poke decides at once the targets (collector keys, by Deployment) that
// got load while their last desired scale was 0 (docs/autoscaling.md,
// "Timing"): a request waiting in the activator should not wait for the
// next tick.
func (r *PodAutoscaler) Poke(loaded []collector.Key) {
	idx := r.zeroIndex.Load()
	if len(loaded) == 0 || idx == nil || len(*idx) == 0 {
		return
	}
	var wake []collector.Key
	for _, k := range loaded {
		if !r.Buckets.Owns(k.Namespace, k.Name) {
			continue // another replica's to wake
		}
		for _, pa := range (*idx)[k] {
			if !slices.Contains(wake, pa) { // loaded may name a target more than once
				wake = append(wake, pa)
			}
		}
	}
	now := time.Now()
	for _, pa := range wake {
		r.pokedAt.LoadOrStore(pa, now) // the first load is when the wait began
		select {
		case r.pokeChannel() <- event.GenericEvent{Object: &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: pa.Namespace, Name: pa.Name}}}:
		default: // a poke is already queued; the tick comes anyway
		}
	}
}

// Priorities in the PodAutoscaler queue. A poke goes before the ticks
// that are due: a request is waiting in an activator. Every tick (and a
// not-ready target's retry) is queued at tickPriority, whatever brought
// the target in last: controller-runtime requeues at the priority of the
// item it took, which was LowPriority (-100) for targets listed at
// start, 0 for those created later (and would be a poke's for good), so
// that under load the targets made after a restart went first.
const (
	tickPriority = 0
	pokePriority = 10
)

// pokeHandler queues a poked PodAutoscaler at pokePriority.
var pokeHandler = handler.TypedFuncs[client.Object, reconcile.Request]{
	GenericFunc: func(_ context.Context, e event.TypedGenericEvent[client.Object], q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(e.Object)}
		if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
			pq.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(pokePriority)}, req)
			return
		}
		q.Add(req)
	},
}

// pokeChannel is the source of pokes, made on first use by Poke or
// SetupWithManager.
func (r *PodAutoscaler) pokeChannel() chan event.GenericEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pokes == nil {
		r.pokes = make(chan event.GenericEvent, 1024)
	}
	return r.pokes
}
