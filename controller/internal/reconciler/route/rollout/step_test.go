package rollout

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

// call is one reconcile of a timeline: Step at t0+at.
type call struct {
	at          time.Duration
	goal        []servingv1alpha1.TrafficTargetStatus // nil: the previous call's
	duration    *time.Duration                        // nil: as the call before
	notInEffect bool                                  // the previous split is not applied yet
	want        []servingv1alpha1.TrafficTargetStatus
	wantSplits  map[string][]Share // nil: not checked
	wantNext    time.Duration      // t0+wantNext; 0: no step scheduled
	wantRolling bool
}

func dur(d time.Duration) *time.Duration { return &d }

func TestStepTimelines(t *testing.T) {
	const h = "hello"
	tests := []struct {
		name     string
		duration time.Duration
		calls    []call
	}{{
		// The example. The pinned entry comes after the latest
		// one, so while hello-00005 is both, Knative merges them into one
		// latest target of 100 % and has a state to roll from.
		name:     "issue example: 55 % latest + 45 % pinned, 1 -> 19 -> 37 -> 55",
		duration: 120 * time.Second,
		calls: []call{{
			at:   0,
			goal: split(latest(h, "hello-00005", 55), pinned("hello-00005", 45)),
			want: split(latest(h, "hello-00005", 55), pinned("hello-00005", 45)),
		}, {
			// 1 % is taken from the latest's 55 %, never from the pin.
			at:          10 * time.Second,
			goal:        split(latest(h, "hello-00006", 55), pinned("hello-00005", 45)),
			want:        split(latest(h, "hello-00005", 54), latest(h, "hello-00006", 1), pinned("hello-00005", 45)),
			wantSplits:  map[string][]Share{"": shares("hello-00005", 99, "hello-00006", 1)},
			wantRolling: true,
		}, {
			at:          25 * time.Second,
			notInEffect: true, // the agents have not applied the 1 % yet: wait
			want:        split(latest(h, "hello-00005", 54), latest(h, "hello-00006", 1), pinned("hello-00005", 45)),
			wantRolling: true,
		}, {
			// Applied 30s after it started: steps of at least 30s in the
			// 90s left: 3 steps of round(54/3) = 18.
			at:          40 * time.Second,
			want:        split(latest(h, "hello-00005", 54), latest(h, "hello-00006", 1), pinned("hello-00005", 45)),
			wantNext:    70 * time.Second,
			wantRolling: true,
		}, {
			at:          69 * time.Second, // too early: nothing moves
			want:        split(latest(h, "hello-00005", 54), latest(h, "hello-00006", 1), pinned("hello-00005", 45)),
			wantNext:    70 * time.Second,
			wantRolling: true,
		}, {
			at:          70 * time.Second,
			want:        split(latest(h, "hello-00005", 36), latest(h, "hello-00006", 19), pinned("hello-00005", 45)),
			wantSplits:  map[string][]Share{"": shares("hello-00005", 81, "hello-00006", 19)},
			wantNext:    100 * time.Second,
			wantRolling: true,
		}, {
			at:          100 * time.Second,
			want:        split(latest(h, "hello-00005", 18), latest(h, "hello-00006", 37), pinned("hello-00005", 45)),
			wantNext:    130 * time.Second,
			wantRolling: true,
		}, {
			at:         130 * time.Second,
			want:       split(latest(h, "hello-00006", 55), pinned("hello-00005", 45)),
			wantSplits: map[string][]Share{"": shares("hello-00006", 55, "hello-00005", 45)},
		}, {
			at:   200 * time.Second,
			want: split(latest(h, "hello-00006", 55), pinned("hello-00005", 45)),
		}},
	}, {
		// Knative merges same-revision entries into the first; a pin
		// first makes the merged target pinned, so hello has no state to
		// roll from and the next revision takes its 55 % at once.
		name:     "pinned entry first: no gradual rollout, as in Knative",
		duration: 120 * time.Second,
		calls: []call{{
			at:   0,
			goal: split(pinned("hello-00005", 45), latest(h, "hello-00005", 55)),
			want: split(pinned("hello-00005", 45), latest(h, "hello-00005", 55)),
		}, {
			at:   10 * time.Second,
			goal: split(pinned("hello-00005", 45), latest(h, "hello-00006", 55)),
			want: split(pinned("hello-00005", 45), latest(h, "hello-00006", 55)),
		}},
	}, {
		// C arrives while B is rolling in: C's 1 % comes from B, and C's
		// steps drain B before A (newest to oldest).
		name:     "newer revision during a rollout drains newest to oldest",
		duration: 20 * time.Second,
		calls: []call{{
			at:   0,
			goal: split(latest(h, "a", 100)),
			want: split(latest(h, "a", 100)),
		}, {
			at:          1 * time.Second,
			goal:        split(latest(h, "b", 100)),
			want:        split(latest(h, "a", 99), latest(h, "b", 1)),
			wantRolling: true,
		}, {
			// 2s to apply: 18s left, 9 steps of round(99/9) = 11.
			at:          3 * time.Second,
			want:        split(latest(h, "a", 99), latest(h, "b", 1)),
			wantNext:    5 * time.Second,
			wantRolling: true,
		}, {
			at:          5 * time.Second,
			want:        split(latest(h, "a", 88), latest(h, "b", 12)),
			wantNext:    7 * time.Second,
			wantRolling: true,
		}, {
			// C's 1 % comes from B, the newest with a share; B's pace is
			// dropped until C's first 1 % is in effect.
			at:          6 * time.Second,
			goal:        split(latest(h, "c", 100)),
			want:        split(latest(h, "a", 88), latest(h, "b", 11), latest(h, "c", 1)),
			wantRolling: true,
		}, {
			// 5s to apply: 15s left, 3 steps of 33.
			at:          11 * time.Second,
			want:        split(latest(h, "a", 88), latest(h, "b", 11), latest(h, "c", 1)),
			wantNext:    16 * time.Second,
			wantRolling: true,
		}, {
			// 33: all of B's 11, then 22 of A.
			at:          16 * time.Second,
			want:        split(latest(h, "a", 66), latest(h, "c", 34)),
			wantNext:    21 * time.Second,
			wantRolling: true,
		}, {
			at:          21 * time.Second,
			want:        split(latest(h, "a", 33), latest(h, "c", 67)),
			wantNext:    26 * time.Second,
			wantRolling: true,
		}, {
			at:   26 * time.Second,
			want: split(latest(h, "c", 100)),
		}},
	}, {
		name:     "late reconcile moves one step, the next timed from now",
		duration: 120 * time.Second,
		calls: []call{{
			at:   0,
			goal: split(latest(h, "a", 100)),
			want: split(latest(h, "a", 100)),
		}, {
			at:          5 * time.Second,
			goal:        split(latest(h, "b", 100)),
			want:        split(latest(h, "a", 99), latest(h, "b", 1)),
			wantRolling: true,
		}, {
			// 10s to apply: 110s left, 11 steps of 9.
			at:          15 * time.Second,
			want:        split(latest(h, "a", 99), latest(h, "b", 1)),
			wantNext:    25 * time.Second,
			wantRolling: true,
		}, {
			at:          60 * time.Second,
			want:        split(latest(h, "a", 90), latest(h, "b", 10)),
			wantNext:    70 * time.Second,
			wantRolling: true,
		}},
	}, {
		// The pace is fixed when the first 1 % is seen in effect; a
		// later change of rollout-duration does not alter it, and a
		// duration under 1s (0 in whole seconds) ends the rollout.
		name:     "duration changes: pace kept, then 0 finishes at once",
		duration: 60 * time.Second,
		calls: []call{{
			at:   0,
			goal: split(latest(h, "a", 100)),
			want: split(latest(h, "a", 100)),
		}, {
			at:          1 * time.Second,
			goal:        split(latest(h, "b", 100)),
			want:        split(latest(h, "a", 99), latest(h, "b", 1)),
			wantRolling: true,
		}, {
			// 10s to apply: 50s left, 5 steps of round(99/5) = 20.
			at:          11 * time.Second,
			want:        split(latest(h, "a", 99), latest(h, "b", 1)),
			wantNext:    21 * time.Second,
			wantRolling: true,
		}, {
			at:          21 * time.Second,
			duration:    dur(600 * time.Second),
			want:        split(latest(h, "a", 79), latest(h, "b", 21)),
			wantNext:    31 * time.Second,
			wantRolling: true,
		}, {
			at:       25 * time.Second,
			duration: dur(500 * time.Millisecond),
			want:     split(latest(h, "b", 100)),
		}, {
			// Off, a new revision takes everything at once; the state
			// still records it, so turning rollouts on works later.
			at:       30 * time.Second,
			duration: dur(0),
			goal:     split(latest(h, "c", 100)),
			want:     split(latest(h, "c", 100)),
		}, {
			at:          35 * time.Second,
			duration:    dur(120 * time.Second),
			goal:        split(latest(h, "d", 100)),
			want:        split(latest(h, "c", 99), latest(h, "d", 1)),
			wantRolling: true,
		}},
	}, {
		// Up: the difference goes to the newest. Down: it is taken from
		// the oldest first.
		name:     "goal percent of a rolling configuration changes",
		duration: 120 * time.Second,
		calls: []call{{
			at:   0,
			goal: split(latest(h, "a", 100)),
			want: split(latest(h, "a", 100)),
		}, {
			at:          1 * time.Second,
			goal:        split(latest(h, "b", 100)),
			want:        split(latest(h, "a", 99), latest(h, "b", 1)),
			wantRolling: true,
		}, {
			at:          11 * time.Second, // 11 steps of 9, every 10s
			want:        split(latest(h, "a", 99), latest(h, "b", 1)),
			wantNext:    21 * time.Second,
			wantRolling: true,
		}, {
			at:          21 * time.Second,
			want:        split(latest(h, "a", 90), latest(h, "b", 10)),
			wantNext:    31 * time.Second,
			wantRolling: true,
		}, {
			at:          25 * time.Second,
			goal:        split(latest(h, "b", 60), pinned("other-00001", 40)),
			want:        split(latest(h, "a", 50), latest(h, "b", 10), pinned("other-00001", 40)),
			wantNext:    31 * time.Second,
			wantRolling: true,
		}, {
			at:          31 * time.Second,
			want:        split(latest(h, "a", 41), latest(h, "b", 19), pinned("other-00001", 40)),
			wantNext:    41 * time.Second,
			wantRolling: true,
		}, {
			at:          35 * time.Second,
			goal:        split(latest(h, "b", 80), pinned("other-00001", 20)),
			want:        split(latest(h, "a", 41), latest(h, "b", 39), pinned("other-00001", 20)),
			wantNext:    41 * time.Second,
			wantRolling: true,
		}, {
			at:          41 * time.Second,
			want:        split(latest(h, "a", 32), latest(h, "b", 48), pinned("other-00001", 20)),
			wantNext:    51 * time.Second,
			wantRolling: true,
		}, {
			// 50 less: A's 32 and 18 of B, which is then alone: done.
			at:   45 * time.Second,
			goal: split(latest(h, "b", 30), pinned("other-00001", 70)),
			want: split(latest(h, "b", 30), pinned("other-00001", 70)),
		}},
	}, {
		name:     "configuration removed: its rollout is forgotten, the other goes on",
		duration: 120 * time.Second,
		calls: []call{{
			at:   0,
			goal: split(latest("bye", "bye-1", 50), latest(h, "h1", 50)),
			want: split(latest("bye", "bye-1", 50), latest(h, "h1", 50)),
		}, {
			at:          1 * time.Second,
			goal:        split(latest("bye", "bye-1", 50), latest(h, "h2", 50)),
			want:        split(latest("bye", "bye-1", 50), latest(h, "h1", 49), latest(h, "h2", 1)),
			wantRolling: true,
		}, {
			// 10s: 11 steps of round(49/11 = 4.45) = 4.
			at:          11 * time.Second,
			want:        split(latest("bye", "bye-1", 50), latest(h, "h1", 49), latest(h, "h2", 1)),
			wantNext:    21 * time.Second,
			wantRolling: true,
		}, {
			at:          21 * time.Second,
			want:        split(latest("bye", "bye-1", 50), latest(h, "h1", 45), latest(h, "h2", 5)),
			wantNext:    31 * time.Second,
			wantRolling: true,
		}, {
			// bye removed; hello's 50 more go to its newest.
			at:          25 * time.Second,
			goal:        split(latest(h, "h2", 100)),
			want:        split(latest(h, "h1", 45), latest(h, "h2", 55)),
			wantNext:    31 * time.Second,
			wantRolling: true,
		}, {
			at:          31 * time.Second,
			want:        split(latest(h, "h1", 41), latest(h, "h2", 59)),
			wantNext:    41 * time.Second,
			wantRolling: true,
		}, {
			// hello removed mid-rollout, bye back with a new revision:
			// nothing to roll from, so at once.
			at:   33 * time.Second,
			goal: split(latest("bye", "bye-2", 100)),
			want: split(latest("bye", "bye-2", 100)),
		}},
	}, {
		name:     "several configurations, each at its own pace; NextStep is the earliest",
		duration: 120 * time.Second,
		calls: []call{{
			at:   0,
			goal: split(latest(h, "h1", 40), latest("bye", "b1", 60)),
			want: split(latest(h, "h1", 40), latest("bye", "b1", 60)),
		}, {
			at:          1 * time.Second,
			goal:        split(latest(h, "h2", 40), latest("bye", "b1", 60)),
			want:        split(latest(h, "h1", 39), latest(h, "h2", 1), latest("bye", "b1", 60)),
			wantRolling: true,
		}, {
			// hello: 10s, 11 steps of round(39/11 = 3.55) = 4.
			at:          11 * time.Second,
			want:        split(latest(h, "h1", 39), latest(h, "h2", 1), latest("bye", "b1", 60)),
			wantNext:    21 * time.Second,
			wantRolling: true,
		}, {
			at:          15 * time.Second,
			goal:        split(latest(h, "h2", 40), latest("bye", "b2", 60)),
			want:        split(latest(h, "h1", 39), latest(h, "h2", 1), latest("bye", "b1", 59), latest("bye", "b2", 1)),
			wantNext:    21 * time.Second,
			wantRolling: true,
		}, {
			// bye: 2s, 118s left, 59 steps of 1 every 2s.
			at:          17 * time.Second,
			want:        split(latest(h, "h1", 39), latest(h, "h2", 1), latest("bye", "b1", 59), latest("bye", "b2", 1)),
			wantNext:    19 * time.Second,
			wantRolling: true,
		}, {
			at:          19 * time.Second,
			want:        split(latest(h, "h1", 39), latest(h, "h2", 1), latest("bye", "b1", 58), latest("bye", "b2", 2)),
			wantNext:    21 * time.Second,
			wantRolling: true,
		}, {
			at:          21 * time.Second,
			want:        split(latest(h, "h1", 35), latest(h, "h2", 5), latest("bye", "b1", 57), latest("bye", "b2", 3)),
			wantNext:    23 * time.Second,
			wantRolling: true,
		}},
	}, {
		// A configuration at 1 % cannot be split: its new revision takes
		// the 1 % at once, while the other rolls (Knative's a/b case).
		name:     "a/b: the 99 % configuration rolls, the 1 % one switches",
		duration: 120 * time.Second,
		calls: []call{{
			at:   0,
			goal: split(latest("keith", "k1", 99), latest("mick", "m1", 1)),
			want: split(latest("keith", "k1", 99), latest("mick", "m1", 1)),
		}, {
			at:          1 * time.Second,
			goal:        split(latest("keith", "k2", 99), latest("mick", "m2", 1)),
			want:        split(latest("keith", "k1", 98), latest("keith", "k2", 1), latest("mick", "m2", 1)),
			wantRolling: true,
		}},
	}, {
		name:     "0 % configuration target: nothing to roll",
		duration: 120 * time.Second,
		calls: []call{{
			at:   0,
			goal: split(latest(h, "a", 0), pinned("other-00001", 100)),
			want: split(latest(h, "a", 0), pinned("other-00001", 100)),
		}, {
			at:         1 * time.Second,
			goal:       split(latest(h, "b", 0), pinned("other-00001", 100)),
			want:       split(latest(h, "b", 0), pinned("other-00001", 100)),
			wantSplits: map[string][]Share{"": shares("other-00001", 100)},
		}},
	}, {
		// Knative's status merges entries with the same tag, revision and
		// latestRevision.
		name:     "same-revision entries merged in Traffic",
		duration: 120 * time.Second,
		calls: []call{{
			at:         0,
			goal:       split(pinned("a", 30), latest(h, "b", 50), pinned("a", 20), pinned("a", 0).tagged("old")),
			want:       split(pinned("a", 50), latest(h, "b", 50), pinned("a", 0).tagged("old")),
			wantSplits: map[string][]Share{"": shares("a", 50, "b", 50), "old": shares("a", 100)},
		}},
	}, {
		name:     "first reconcile, no previous state: the goal at once",
		duration: 120 * time.Second,
		calls: []call{{
			at:   0,
			goal: split(latest(h, "b", 100)),
			want: split(latest(h, "b", 100)),
		}},
	}, {
		// The Route's host and the tag's host roll on their own; the tag
		// entry's percent is its share of the Route's host (0 here), and
		// the tag host's split is in Splits.
		name:     "tagged latest target at 0 %",
		duration: 120 * time.Second,
		calls: []call{{
			at:   0,
			goal: split(latest(h, "a", 100), latest(h, "a", 0).tagged("latest")),
			want: split(latest(h, "a", 100), latest(h, "a", 0).tagged("latest")),
		}, {
			at:          1 * time.Second,
			goal:        split(latest(h, "b", 100), latest(h, "b", 0).tagged("latest")),
			want:        split(latest(h, "a", 99), latest(h, "b", 1), latest(h, "b", 0).tagged("latest")),
			wantSplits:  map[string][]Share{"": shares("a", 99, "b", 1), "latest": shares("a", 99, "b", 1)},
			wantRolling: true,
		}, {
			at:          11 * time.Second,
			want:        split(latest(h, "a", 99), latest(h, "b", 1), latest(h, "b", 0).tagged("latest")),
			wantNext:    21 * time.Second,
			wantRolling: true,
		}, {
			at:          21 * time.Second,
			want:        split(latest(h, "a", 90), latest(h, "b", 10), latest(h, "b", 0).tagged("latest")),
			wantSplits:  map[string][]Share{"": shares("a", 90, "b", 10), "latest": shares("a", 90, "b", 10)},
			wantNext:    31 * time.Second,
			wantRolling: true,
		}},
	}, {
		// Both entries follow hello: the Route's host has one hello
		// group of 100 %, shared out in entry order, oldest revision
		// first; the tag host has its own group of 100 %.
		name:     "tagged latest target with a share",
		duration: 120 * time.Second,
		calls: []call{{
			at:   0,
			goal: split(latest(h, "a", 90), latest(h, "a", 10).tagged("x")),
			want: split(latest(h, "a", 90), latest(h, "a", 10).tagged("x")),
		}, {
			at:          1 * time.Second,
			goal:        split(latest(h, "b", 90), latest(h, "b", 10).tagged("x")),
			want:        split(latest(h, "a", 90), latest(h, "a", 9).tagged("x"), latest(h, "b", 1).tagged("x")),
			wantSplits:  map[string][]Share{"": shares("a", 99, "b", 1), "x": shares("a", 99, "b", 1)},
			wantRolling: true,
		}, {
			at:          11 * time.Second,
			want:        split(latest(h, "a", 90), latest(h, "a", 9).tagged("x"), latest(h, "b", 1).tagged("x")),
			wantNext:    21 * time.Second,
			wantRolling: true,
		}, {
			at:          21 * time.Second,
			want:        split(latest(h, "a", 90), latest(h, "b", 10).tagged("x")),
			wantNext:    31 * time.Second,
			wantRolling: true,
		}, {
			at:          31 * time.Second,
			want:        split(latest(h, "a", 81), latest(h, "b", 9), latest(h, "b", 10).tagged("x")),
			wantNext:    41 * time.Second,
			wantRolling: true,
		}},
	}, {
		// A pinned target gets nothing from a rollout and a tag added to
		// it later does not start one.
		name:     "tag added to a pinned target",
		duration: 120 * time.Second,
		calls: []call{{
			at:   0,
			goal: split(latest(h, "b", 100), pinned("a", 0)),
			want: split(latest(h, "b", 100), pinned("a", 0)),
		}, {
			at:         1 * time.Second,
			goal:       split(latest(h, "b", 100), pinned("a", 0).tagged("old")),
			want:       split(latest(h, "b", 100), pinned("a", 0).tagged("old")),
			wantSplits: map[string][]Share{"": shares("b", 100), "old": shares("a", 100)},
		}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var annotation string
			var goal []servingv1alpha1.TrafficTargetStatus
			duration := tc.duration
			for i, c := range tc.calls {
				if c.goal != nil {
					goal = c.goal
				}
				if c.duration != nil {
					duration = *c.duration
				}
				prev, err := Decode(annotation)
				if err != nil {
					t.Fatalf("call %d: Decode(%q): %v", i, annotation, err)
				}
				now := t0.Add(c.at)
				got := Step(prev, goal, now, duration, !c.notInEffect)
				if diff := cmp.Diff(c.want, got.Traffic); diff != "" {
					t.Errorf("call %d at +%v: Traffic (-want +got):\n%s", i, c.at, diff)
				}
				if c.wantSplits != nil {
					for host, want := range c.wantSplits {
						if diff := cmp.Diff(want, got.Splits[host]); diff != "" {
							t.Errorf("call %d at +%v: Splits[%q] (-want +got):\n%s", i, c.at, host, diff)
						}
					}
				}
				var wantNext time.Time
				if c.wantNext != 0 {
					wantNext = t0.Add(c.wantNext)
				}
				if !got.NextStep.Equal(wantNext) {
					t.Errorf("call %d at +%v: NextStep = %v, want %v", i, c.at, got.NextStep, wantNext)
				}
				if got.InProgress != c.wantRolling {
					t.Errorf("call %d at +%v: InProgress = %v, want %v", i, c.at, got.InProgress, c.wantRolling)
				}
				if annotation, err = Encode(got.State); err != nil {
					t.Fatalf("call %d: Encode: %v", i, err)
				}
			}
		})
	}
}
