package rollout

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// The cases below carry the numbers of Knative's own unit tests for
// pkg/reconciler/route/traffic/rollout.go (TestStep, TestObserveReady,
// TestAdjustPercentage, TestStepRevisions), on this package's types.

func grp(config, tag string, pct int, tm Timing, revs ...Share) Group {
	return Group{Configuration: config, Tag: tag, Percent: pct, Revisions: revs, Timing: tm}
}

func rev(name string, pct int) Share { return Share{RevisionName: name, Percent: pct} }

func TestAdvance(t *testing.T) {
	const now = 2020
	tests := []struct {
		name            string
		prev, cur, want []Group
		wantNext        int64
	}{{
		name: "no previous state",
		cur:  []Group{grp("mick", "", 100, Timing{}, rev("m1", 100))},
		want: []Group{grp("mick", "", 100, Timing{}, rev("m1", 100))},
	}, {
		name: "previous group without revisions",
		prev: []Group{grp("mick", "", 100, Timing{})},
		cur:  []Group{grp("mick", "", 100, Timing{}, rev("m1", 100))},
		want: []Group{grp("mick", "", 100, Timing{}, rev("m1", 100))},
	}, {
		name: "same revision, settled",
		prev: []Group{grp("mick", "", 100, Timing{}, rev("m1", 100))},
		cur:  []Group{grp("mick", "", 100, Timing{}, rev("m1", 100))},
		want: []Group{grp("mick", "", 100, Timing{}, rev("m1", 100))},
	}, {
		name: "step due",
		prev: []Group{grp("mick", "", 100, Timing{StartUnixNano: 2004, StepNanos: 5, StepPercent: 3, NextStepUnixNano: 2019},
			rev("m0", 95), rev("m1", 5))},
		cur: []Group{grp("mick", "", 100, Timing{}, rev("m1", 100))},
		want: []Group{grp("mick", "", 100, Timing{StartUnixNano: 2004, StepNanos: 5, StepPercent: 3, NextStepUnixNano: now + 5},
			rev("m0", 92), rev("m1", 8))},
		wantNext: now + 5,
	}, {
		name: "two configurations step; the earliest next step wins",
		prev: []Group{
			grp("mick", "", 42, Timing{StartUnixNano: 1961, StepNanos: 43, StepPercent: 3, NextStepUnixNano: 2019}, rev("m0", 37), rev("m1", 5)),
			grp("keith", "", 52, Timing{StartUnixNano: 1971, StepNanos: 55, StepPercent: 4, NextStepUnixNano: 2018}, rev("k0", 36), rev("k1", 16)),
		},
		cur: []Group{grp("keith", "", 52, Timing{}, rev("k1", 52)), grp("mick", "", 42, Timing{}, rev("m1", 42))},
		want: []Group{
			grp("keith", "", 52, Timing{StartUnixNano: 1971, StepNanos: 55, StepPercent: 4, NextStepUnixNano: now + 55}, rev("k0", 32), rev("k1", 20)),
			grp("mick", "", 42, Timing{StartUnixNano: 1961, StepNanos: 43, StepPercent: 3, NextStepUnixNano: now + 43}, rev("m0", 34), rev("m1", 8)),
		},
		wantNext: now + 43,
	}, {
		name: "one configuration steps, the other gets a new revision",
		prev: []Group{
			grp("keith", "", 52, Timing{StartUnixNano: 1971, StepNanos: 55, StepPercent: 4, NextStepUnixNano: 2018}, rev("k0", 36), rev("k1", 16)),
			grp("mick", "", 42, Timing{StartUnixNano: 1961, StepNanos: 43, StepPercent: 3, NextStepUnixNano: 2019}, rev("m0", 37), rev("m1", 5)),
		},
		cur: []Group{grp("keith", "", 52, Timing{}, rev("k2", 52)), grp("mick", "", 42, Timing{}, rev("m1", 42))},
		want: []Group{
			grp("keith", "", 52, Timing{StartUnixNano: now}, rev("k0", 36), rev("k1", 15), rev("k2", 1)),
			grp("mick", "", 42, Timing{StartUnixNano: 1961, StepNanos: 43, StepPercent: 3, NextStepUnixNano: now + 43}, rev("m0", 34), rev("m1", 8)),
		},
		wantNext: now + 43,
	}, {
		name: "pace not known yet: no step",
		prev: []Group{grp("mick", "", 100, Timing{StartUnixNano: 2004}, rev("m0", 95), rev("m1", 5))},
		cur:  []Group{grp("mick", "", 100, Timing{}, rev("m1", 100))},
		want: []Group{grp("mick", "", 100, Timing{StartUnixNano: 2004}, rev("m0", 95), rev("m1", 5))},
	}, {
		// A configuration that drops to 0 % has no current group.
		name: "configuration gone to 0 %",
		prev: []Group{grp("charlie", "", 100, Timing{}, rev("c0", 100))},
		want: nil,
	}, {
		name: "new revision: 1 %, previous timing dropped",
		prev: []Group{grp("mick", "", 100, Timing{StartUnixNano: 1981, StepNanos: 1988, StepPercent: 11, NextStepUnixNano: 1984}, rev("m0", 100))},
		cur:  []Group{grp("mick", "", 100, Timing{}, rev("m1", 100))},
		want: []Group{grp("mick", "", 100, Timing{StartUnixNano: now}, rev("m0", 99), rev("m1", 1))},
	}, {
		name: "new revision while the percent goes down",
		prev: []Group{grp("mick", "", 42, Timing{}, rev("m0", 11), rev("m1", 31))},
		cur:  []Group{grp("mick", "", 33, Timing{}, rev("m2", 33))},
		want: []Group{grp("mick", "", 33, Timing{StartUnixNano: now}, rev("m0", 2), rev("m1", 30), rev("m2", 1))},
	}, {
		name: "new revision while the percent goes up",
		prev: []Group{grp("mick", "", 25, Timing{}, rev("m0", 11), rev("m1", 14))},
		cur:  []Group{grp("mick", "", 75, Timing{}, rev("m2", 75))},
		want: []Group{grp("mick", "", 75, Timing{StartUnixNano: now}, rev("m0", 11), rev("m1", 63), rev("m2", 1))},
	}, {
		name: "new revision of a configuration under 100 %",
		prev: []Group{grp("brian", "", 70, Timing{}, rev("b0", 70))},
		cur:  []Group{grp("brian", "", 70, Timing{}, rev("b1", 70))},
		want: []Group{grp("brian", "", 70, Timing{StartUnixNano: now}, rev("b0", 69), rev("b1", 1))},
	}, {
		name: "new revision during a rollout: 1 % from the newest",
		prev: []Group{grp("mick", "", 100, Timing{StartUnixNano: now - 1982}, rev("m0", 95), rev("m1", 5))},
		cur:  []Group{grp("mick", "", 100, Timing{}, rev("m2", 100))},
		want: []Group{grp("mick", "", 100, Timing{StartUnixNano: now}, rev("m0", 95), rev("m1", 4), rev("m2", 1))},
	}, {
		name: "new revision replaces one that had only its 1 %",
		prev: []Group{grp("mick", "", 100, Timing{StartUnixNano: now - 1984}, rev("m0", 99), rev("m1", 1))},
		cur:  []Group{grp("mick", "", 100, Timing{}, rev("m2", 100))},
		want: []Group{grp("mick", "", 100, Timing{StartUnixNano: now}, rev("m0", 99), rev("m2", 1))},
	}, {
		name: "1 % configuration switches at once",
		prev: []Group{grp("mick", "", 1, Timing{}, rev("m0", 1))},
		cur:  []Group{grp("mick", "", 1, Timing{}, rev("m1", 1))},
		want: []Group{grp("mick", "", 1, Timing{}, rev("m1", 1))},
	}, {
		name: "tag added: its group starts settled",
		prev: []Group{grp("mick", "", 100, Timing{}, rev("m0", 100))},
		cur:  []Group{grp("mick", "", 100, Timing{}, rev("m0", 100)), grp("mick", "jagger", 100, Timing{}, rev("m0", 100))},
		want: []Group{grp("mick", "", 100, Timing{}, rev("m0", 100)), grp("mick", "jagger", 100, Timing{}, rev("m0", 100))},
	}, {
		name: "configuration removed",
		prev: []Group{grp("keith", "", 50, Timing{}, rev("k0", 50)), grp("mick", "", 50, Timing{}, rev("m0", 50))},
		cur:  []Group{grp("mick", "", 100, Timing{}, rev("m0", 100))},
		want: []Group{grp("mick", "", 100, Timing{}, rev("m0", 100))},
	}, {
		name: "a/b: 99 % rolls, 1 % switches",
		prev: []Group{grp("keith", "", 99, Timing{}, rev("k0", 99)), grp("mick", "", 1, Timing{}, rev("m0", 1))},
		cur:  []Group{grp("keith", "", 99, Timing{}, rev("k1", 99)), grp("mick", "", 1, Timing{}, rev("m1", 1))},
		want: []Group{grp("keith", "", 99, Timing{StartUnixNano: now}, rev("k0", 98), rev("k1", 1)), grp("mick", "", 1, Timing{}, rev("m1", 1))},
	}, {
		name: "configuration added, sorting before the old one",
		prev: []Group{grp("mick", "", 100, Timing{}, rev("m0", 100))},
		cur:  []Group{grp("keith", "", 50, Timing{}, rev("k0", 50)), grp("mick", "", 50, Timing{}, rev("m0", 50))},
		want: []Group{grp("keith", "", 50, Timing{}, rev("k0", 50)), grp("mick", "", 50, Timing{}, rev("m0", 50))},
	}, {
		name: "configuration added, sorting after the old one",
		prev: []Group{grp("keith", "", 100, Timing{}, rev("k0", 100))},
		cur:  []Group{grp("keith", "", 50, Timing{}, rev("k0", 50)), grp("mick", "", 50, Timing{}, rev("m0", 50))},
		want: []Group{grp("keith", "", 50, Timing{}, rev("k0", 50)), grp("mick", "", 50, Timing{}, rev("m0", 50))},
	}, {
		// Knative keeps only the first group of a host new to the state.
		name: "host new to the state keeps its first group only",
		prev: []Group{grp("mick", "x", 100, Timing{}, rev("m0", 100))},
		cur:  []Group{grp("keith", "", 50, Timing{}, rev("k0", 50)), grp("mick", "", 50, Timing{}, rev("m0", 50)), grp("mick", "x", 100, Timing{}, rev("m0", 100))},
		want: []Group{grp("keith", "", 50, Timing{}, rev("k0", 50)), grp("mick", "x", 100, Timing{}, rev("m0", 100))},
	}, {
		// Knative indexes the previous revisions with their count before
		// the cut and would panic here; the newest is compared instead.
		name: "percent cut drops the oldest, same revision",
		prev: []Group{grp("mick", "", 75, Timing{StartUnixNano: 1, StepNanos: 10, StepPercent: 5, NextStepUnixNano: 3000}, rev("m0", 21), rev("m1", 54))},
		cur:  []Group{grp("mick", "", 42, Timing{}, rev("m1", 42))},
		want: []Group{grp("mick", "", 42, Timing{}, rev("m1", 42))},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var prev *State
			if tc.prev != nil {
				prev = &State{Groups: tc.prev}
				sortGroups(prev.Groups)
			}
			got, gotNext := advance(&State{Groups: tc.cur}, prev, now)
			if diff := cmp.Diff(tc.want, got.Groups, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("groups (-want +got):\n%s", diff)
			}
			if gotNext != tc.wantNext {
				t.Errorf("next step = %d, want %d", gotNext, tc.wantNext)
			}
			if err := got.validate(); err != nil {
				t.Errorf("result does not validate: %v", err)
			}
		})
	}
}

func TestObserveInEffect(t *testing.T) {
	const (
		now      = 200620092020 + 1982 // 1982ns after "just now"
		justNow  = 200620092020
		earlier  = 198219841988 // 2.4s before now: 3s
		ancient  = 14921812     // 200s before now: more than the duration
		duration = 120.
	)
	tests := []struct {
		name string
		in   Group
		want Timing
	}{{
		name: "pace already known",
		in:   Group{Percent: 100, Timing: Timing{StepNanos: 11}},
		want: Timing{StepNanos: 11},
	}, {
		name: "no rollout",
		in:   Group{Percent: 100},
		want: Timing{},
	}, {
		// 1982ns counts as the minimum 1s; 119s left for 99 steps of 1.
		name: "applied within 1s",
		in:   Group{Percent: 100, Timing: Timing{StartUnixNano: justNow}},
		want: Timing{StartUnixNano: justNow, StepNanos: 1202020202, StepPercent: 1, NextStepUnixNano: now + 1202020202},
	}, {
		// 3s: 117s left, 39 steps of round(99/39 = 2.54) = 3.
		name: "applied after 2.4s",
		in:   Group{Percent: 100, Timing: Timing{StartUnixNano: earlier}},
		want: Timing{StartUnixNano: earlier, StepNanos: int64(3 * time.Second), StepPercent: 3, NextStepUnixNano: now + int64(3*time.Second)},
	}, {
		// 39 steps of round(74/39 = 1.9) = 2.
		name: "75 %, step rounds up",
		in:   Group{Percent: 75, Timing: Timing{StartUnixNano: earlier}},
		want: Timing{StartUnixNano: earlier, StepNanos: int64(3 * time.Second), StepPercent: 2, NextStepUnixNano: now + int64(3*time.Second)},
	}, {
		// 39 steps of round(49/39 = 1.26) = 1.
		name: "50 %, step rounds down",
		in:   Group{Percent: 50, Timing: Timing{StartUnixNano: earlier}},
		want: Timing{StartUnixNano: earlier, StepNanos: int64(3 * time.Second), StepPercent: 1, NextStepUnixNano: now + int64(3*time.Second)},
	}, {
		// Longer than the whole duration: one step of all the rest, 1s on.
		name: "applied after more than the duration",
		in:   Group{Percent: 13, Timing: Timing{StartUnixNano: ancient}},
		want: Timing{StartUnixNano: ancient, StepNanos: int64(time.Second), StepPercent: 12, NextStepUnixNano: now + int64(time.Second)},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := tc.in
			g.observeInEffect(now, duration)
			if diff := cmp.Diff(tc.want, g.Timing); diff != "" {
				t.Errorf("timing (-want +got):\n%s", diff)
			}
		})
	}
}

func TestResize(t *testing.T) {
	tests := []struct {
		name     string
		from, to int
		in, want []int
	}{
		{name: "same, 100 %", from: 100, to: 100, in: []int{71, 29}, want: []int{71, 29}},
		{name: "same, 42 %", from: 42, to: 42, in: []int{21, 21}, want: []int{21, 21}},
		{name: "up 42 -> 75: the newest gains", from: 42, to: 75, in: []int{21, 21}, want: []int{21, 54}},
		{name: "down 75 -> 42: the oldest goes", from: 75, to: 42, in: []int{21, 54}, want: []int{42}},
		{name: "down 75 -> 42: one goes, one shrinks", from: 75, to: 42, in: []int{21, 22, 32}, want: []int{10, 32}},
		{name: "down 75 -> 42: two go", from: 75, to: 42, in: []int{10, 5, 60}, want: []int{42}},
		{name: "to 0 %", from: 75, to: 0, in: []int{10, 5, 60}, want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var in []Share
			for _, p := range tc.in {
				in = append(in, Share{Percent: p})
			}
			var got []int
			for _, s := range resize(in, tc.from, tc.to) {
				got = append(got, s.Percent)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("percents (-want +got):\n%s", diff)
			}
		})
	}
}

func TestStepRevisions(t *testing.T) {
	pcts := func(ps ...int) []Share {
		var out []Share
		for i, p := range ps {
			out = append(out, Share{RevisionName: string(rune('a' + i)), Percent: p})
		}
		return out
	}
	tests := []struct {
		name string
		now  int64
		in   Group
		want Group
	}{{
		name: "too soon",
		now:  1982,
		in:   Group{Percent: 75, Timing: Timing{NextStepUnixNano: 1984, StepPercent: 10}, Revisions: pcts(10, 5, 60)},
		want: Group{Percent: 75, Timing: Timing{NextStepUnixNano: 1984, StepPercent: 10}, Revisions: pcts(10, 5, 60)},
	}, {
		name: "settled",
		now:  1982,
		in:   Group{Percent: 10, Timing: Timing{NextStepUnixNano: 1984, StepNanos: 10, StepPercent: 10}, Revisions: pcts(10)},
		want: Group{Percent: 10, Timing: Timing{NextStepUnixNano: 1984, StepNanos: 10, StepPercent: 10}, Revisions: pcts(10)},
	}, {
		name: "due exactly now",
		now:  1984,
		in:   Group{Percent: 90, Timing: Timing{NextStepUnixNano: 1984, StepNanos: 55, StepPercent: 10}, Revisions: pcts(30, 60)},
		want: Group{Percent: 90, Timing: Timing{NextStepUnixNano: 1984 + 55, StepNanos: 55, StepPercent: 10}, Revisions: pcts(20, 70)},
	}, {
		// 10: c's 3, b's 5, 2 of a; d is then the second revision.
		name: "step empties the newer ones first",
		now:  1988,
		in:   Group{Percent: 90, Timing: Timing{NextStepUnixNano: 1984, StepNanos: 55, StepPercent: 10}, Revisions: pcts(22, 5, 3, 60)},
		want: Group{Percent: 90, Timing: Timing{NextStepUnixNano: 1988 + 55, StepNanos: 55, StepPercent: 10},
			Revisions: []Share{{RevisionName: "a", Percent: 20}, {RevisionName: "d", Percent: 70}}},
	}, {
		name: "step larger than what is left: capped, done",
		now:  1988,
		in:   Group{Percent: 15, Timing: Timing{NextStepUnixNano: 1984, StepNanos: 77, StepPercent: 10}, Revisions: pcts(5, 1, 1, 8)},
		want: Group{Percent: 15, Revisions: []Share{{RevisionName: "d", Percent: 15}}},
	}, {
		name: "the very last step",
		now:  2006,
		in:   Group{Percent: 15, Timing: Timing{StartUnixNano: 1977, NextStepUnixNano: 1984, StepNanos: 77, StepPercent: 8}, Revisions: pcts(5, 1, 1, 8)},
		want: Group{Percent: 15, Revisions: []Share{{RevisionName: "d", Percent: 15}}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := tc.in
			g.stepRevisions(tc.now)
			if diff := cmp.Diff(tc.want, g); diff != "" {
				t.Errorf("group (-want +got):\n%s", diff)
			}
		})
	}
}
