package kpa

import (
	"testing"

	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/decider"
)

func TestBounded(t *testing.T) {
	s := func(mutate func(*config.Settings)) config.Settings {
		st, _ := config.Effective(config.Defaults(), 0, nil, nil)
		mutate(&st)
		return st
	}
	valid := func(n int32) decider.Decision { return decider.Decision{Valid: true, DesiredScale: n} }
	tests := []struct {
		name        string
		dec         decider.Decision
		s           config.Settings
		current     int32
		initialized bool
		unreachable bool
		want        int32
	}{
		{"no data keeps the current scale", decider.Decision{DesiredScale: -1}, s(func(*config.Settings) {}), 3, true, false, 3},
		{"min-scale lifts", valid(1), s(func(c *config.Settings) { c.MinScale = 2 }), 1, true, false, 2},
		{"max-scale caps", valid(30), s(func(c *config.Settings) { c.MaxScale = 10 }), 1, true, false, 10},
		{"initial scale holds until reached", valid(1), s(func(c *config.Settings) { c.InitialScale = 3 }), 3, false, false, 3},
		{"initial scale no longer applies once reached", valid(1), s(func(c *config.Settings) { c.InitialScale = 3 }), 3, true, false, 1},
		{"idle with scale to zero: 0 is wished (zeroState decides when)", valid(0), s(func(*config.Settings) {}), 2, true, false, 0},
		{"scale to zero disabled keeps one pod", valid(0), s(func(c *config.Settings) { c.EnableScaleToZero = false }), 2, true, false, 1},
		{"min-scale 1 keeps one pod", valid(0), s(func(c *config.Settings) { c.MinScale = 1 }), 2, true, false, 1},
		// Knative: min-scale and initial scale hold only a reachable target.
		{"unreachable: min-scale does not apply", valid(0), s(func(c *config.Settings) { c.MinScale = 3 }), 3, true, true, 0},
		{"unreachable: initial scale does not apply", valid(1), s(func(c *config.Settings) { c.InitialScale = 3 }), 3, false, true, 1},
		{"unreachable: max-scale still caps", valid(30), s(func(c *config.Settings) { c.MaxScale = 10 }), 1, true, true, 10},
		{"unreachable without scale to zero: one pod", valid(0), s(func(c *config.Settings) { c.EnableScaleToZero = false }), 2, true, true, 1},
	}
	for _, tt := range tests {
		if got := bounded(tt.dec, tt.s, tt.current, tt.initialized, !tt.unreachable); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
}
