package kpa

import (
	"testing"

	"github.com/sockscale/sockscale/controller/internal/collector"
)

// TestPokeWakesOnlyTargetsAtZero: load for a target whose last decision
// was 0 pods queues it at once; a target with pods, or not decided yet,
// waits for its tick.
func TestPokeWakesOnlyTargetsAtZero(t *testing.T) {
	r := &PodAutoscaler{targets: map[collector.Key]*targetState{
		{Namespace: "default", Name: "idle-pa"}:  {collected: collector.Key{Namespace: "default", Name: "idle"}, lastDesired: 0},
		{Namespace: "default", Name: "busy-pa"}:  {collected: collector.Key{Namespace: "default", Name: "busy"}, lastDesired: 3},
		{Namespace: "default", Name: "fresh-pa"}: {collected: collector.Key{Namespace: "default", Name: "fresh"}, lastDesired: -1},
	}}
	r.Poke([]collector.Key{{Namespace: "default", Name: "idle"}, {Namespace: "default", Name: "busy"}, {Namespace: "default", Name: "fresh"}})
	ch := r.pokeChannel()
	if len(ch) != 1 {
		t.Fatalf("%d pokes queued, want 1", len(ch))
	}
	if ev := <-ch; ev.Object.GetName() != "idle-pa" || ev.Object.GetNamespace() != "default" {
		t.Errorf("poked %s/%s, want default/idle-pa (the PodAutoscaler, not the Deployment)", ev.Object.GetNamespace(), ev.Object.GetName())
	}
}
