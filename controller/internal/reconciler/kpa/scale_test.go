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
		want        int32
	}{
		{"no data keeps the current scale", decider.Decision{DesiredScale: -1}, s(func(*config.Settings) {}), 3, true, 3},
		{"min-scale lifts", valid(1), s(func(c *config.Settings) { c.MinScale = 2 }), 1, true, 2},
		{"max-scale caps", valid(30), s(func(c *config.Settings) { c.MaxScale = 10 }), 1, true, 10},
		{"initial scale holds until reached", valid(1), s(func(c *config.Settings) { c.InitialScale = 3 }), 3, false, 3},
		{"initial scale no longer applies once reached", valid(1), s(func(c *config.Settings) { c.InitialScale = 3 }), 3, true, 1},
		{"idle with scale to zero: 0 is wished (zeroState decides when)", valid(0), s(func(*config.Settings) {}), 2, true, 0},
		{"scale to zero disabled keeps one pod", valid(0), s(func(c *config.Settings) { c.EnableScaleToZero = false }), 2, true, 1},
		{"min-scale 1 keeps one pod", valid(0), s(func(c *config.Settings) { c.MinScale = 1 }), 2, true, 1},
	}
	for _, tt := range tests {
		if got := bounded(tt.dec, tt.s, tt.current, tt.initialized); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
}
