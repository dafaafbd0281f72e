package kpa

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/sockscale/sockscale/controller/api/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
)

// Poke decides at once the targets (collector keys, by Deployment) that
// got load while their last desired scale was 0 (KPA.md "Timing"): a
// request waiting in the activator should not wait for the next tick.
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
	for _, pa := range wake {
		select {
		case r.pokeChannel() <- event.GenericEvent{Object: &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: pa.Namespace, Name: pa.Name}}}:
		default: // a poke is already queued; the tick comes anyway
		}
	}
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
