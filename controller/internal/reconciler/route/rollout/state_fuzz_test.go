package rollout

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

// FuzzDecode: the rollout annotation lives on the Route, which its owner
// may edit; Decode must let through only states Step can continue from.
//
//	| input                | invariant                                                     |
//	|----------------------|---------------------------------------------------------------|
//	| blank                | no state, no error                                            |
//	| refused              | no state; the error wraps ErrInvalidState                     |
//	| accepted             | groups sorted by (tag, configuration), each pair once; every  |
//	|                      | percent in 0..100; a group's revisions, each named, sum to    |
//	|                      | its percent; 0 <= stepPercent <= percent; no negative time;   |
//	|                      | a rollout (2+ revisions) only in a group of 2 % or more       |
//	| accepted             | Decode(Encode(s)) equals s                                    |
//	| accepted, any goal,  | Step does not panic and checkResult holds (Traffic sums to    |
//	| time and duration    | the goal's, each host's split to 100, the state it returns    |
//	|                      | validates and round-trips, ...)                               |
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"groups":[{"configuration":"hello","percent":55,"revisions":[{"revisionName":"hello-00005","percent":36},{"revisionName":"hello-00006","percent":19}],` +
			`"timing":{"startUnixNano":1764072010000000000,"stepNanos":30000000000,"stepPercent":18,"nextStepUnixNano":1764072070000000000}},` +
			`{"configuration":"hello","tag":"latest","percent":100,"revisions":[{"revisionName":"hello-00006","percent":100}]}]}`,
		`{"groups":[{"configuration":"b","tag":"x","percent":100,"revisions":[{"revisionName":"b1","percent":100}]},` +
			`{"configuration":"b","percent":50,"revisions":[{"revisionName":"b1","percent":50}]},` +
			`{"configuration":"a","percent":50,"revisions":[{"revisionName":"a1","percent":50}]}]}`,
		`{"groups":[{"configuration":"keith","percent":71,"revisions":[{"revisionName":"k","percent":71}],"timing":{"stepPercent":75}}]}`,
		`{"groups":[{"configuration":"keith","percent":1,"revisions":[{"revisionName":"k","percent":1},{"revisionName":"s","percent":0}]}]}`,
		`{"groups":[{"percent":0}]}`,
		`{"groups":[`,
		`{}`,
		" ",
	} {
		f.Add(s, uint8(0), uint16(0), false)
	}
	f.Add(`{"groups":[{"configuration":"hello","percent":100,"revisions":[{"revisionName":"hello-00005","percent":100}]}]}`, uint8(1), uint16(30), true)
	goals := [][]servingv1alpha1.TrafficTargetStatus{
		split(latest("hello", "hello-00006", 100)),
		split(latest("hello", "hello-00006", 55), pinned("hello-00005", 45)),
		split(latest("hello", "hello-00006", 100), latest("hello", "hello-00006", 0).tagged("latest")),
		split(latest("a", "a-00002", 50), latest("b", "b1", 50), pinned("b1", 0).tagged("x")),
	}
	f.Fuzz(func(t *testing.T, in string, goal uint8, secs uint16, inEffect bool) {
		st, err := Decode(in)
		if strings.TrimSpace(in) == "" {
			if st != nil || err != nil {
				t.Fatalf("Decode(%q) = %+v, %v; want nil, nil", in, st, err)
			}
			return
		}
		if err != nil {
			if st != nil {
				t.Errorf("Decode(%q) = %+v with error %v", in, st, err)
			}
			if !errors.Is(err, ErrInvalidState) {
				t.Errorf("Decode(%q) error %q does not wrap ErrInvalidState", in, err)
			}
			return
		}
		checkState(t, in, st)
		enc, err := Encode(st)
		if err != nil {
			t.Fatalf("Encode(Decode(%q)): %v", in, err)
		}
		again, err := Decode(enc)
		if err != nil {
			t.Fatalf("Decode(%q) = %+v, but its encoding %q is refused: %v", in, st, enc, err)
		}
		if diff := cmp.Diff(st, again, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("Decode(%q): Decode(Encode) differs (-first +again):\n%s", in, diff)
		}

		g := goals[int(goal)%len(goals)]
		now := t0.Add(time.Duration(secs) * time.Second)
		d := durations[int(goal/4)%len(durations)]
		res := Step(st, deepCopy(g), now, d, inEffect)
		checkResult(t, "Step(Decode("+in+"))", st, g, now, res)
	})
}

// checkState checks what Decode documents of an accepted state.
func checkState(t *testing.T, in string, st *State) {
	t.Helper()
	if st == nil {
		t.Fatalf("Decode(%q) = nil, nil for a state that is not blank", in)
	}
	seen := map[[2]string]bool{}
	for i, g := range st.Groups {
		if i > 0 {
			p := st.Groups[i-1]
			if p.Tag > g.Tag || (p.Tag == g.Tag && p.Configuration > g.Configuration) {
				t.Errorf("Decode(%q): groups not sorted by tag, configuration: %+v", in, st.Groups)
			}
		}
		key := [2]string{g.Tag, g.Configuration}
		if seen[key] || g.Configuration == "" {
			t.Errorf("Decode(%q): group %d repeats or lacks its configuration: %+v", in, i, g)
		}
		seen[key] = true
		if g.Percent < 0 || g.Percent > 100 || g.Timing.StepPercent < 0 || g.Timing.StepPercent > g.Percent {
			t.Errorf("Decode(%q): group %d percents out of bounds: %+v", in, i, g)
		}
		if g.Timing.StartUnixNano < 0 || g.Timing.StepNanos < 0 || g.Timing.NextStepUnixNano < 0 {
			t.Errorf("Decode(%q): group %d negative time: %+v", in, i, g.Timing)
		}
		if len(g.Revisions) > 1 && g.Percent < 2 {
			t.Errorf("Decode(%q): group %d rolls out within %d %%", in, i, g.Percent)
		}
		sum := 0
		for _, r := range g.Revisions {
			if r.RevisionName == "" || r.Percent < 0 || r.Percent > 100 {
				t.Errorf("Decode(%q): group %d share %+v", in, i, r)
			}
			sum += r.Percent
		}
		if sum != g.Percent {
			t.Errorf("Decode(%q): group %d revisions sum to %d, not %d", in, i, sum, g.Percent)
		}
	}
}
