package rollout

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/ptr"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

// world is a random Route: up to three configurations, each with a
// latest revision, and a goal of latest and pinned entries.
type world struct {
	r      *rand.Rand
	latest []int // per configuration, its latest revision's number
	shape  []entry
}

type entry struct {
	config int  // configuration index
	pinned int  // revision number if pinned, else 0
	tag    bool // tagged t<index>
	pct    int64
}

func (w *world) reshape() {
	n := 1 + w.r.IntN(4)
	w.shape = make([]entry, n)
	left := int64(100)
	for i := range w.shape {
		e := entry{config: w.r.IntN(len(w.latest)), tag: w.r.IntN(4) == 0}
		if w.r.IntN(3) == 0 {
			e.pinned = 1 + w.r.IntN(w.latest[e.config])
		}
		if i == n-1 {
			e.pct = left
		} else {
			e.pct = w.r.Int64N(left + 1)
		}
		left -= e.pct
		w.shape[i] = e
	}
}

func (w *world) goal() []servingv1alpha1.TrafficTargetStatus {
	var out []servingv1alpha1.TrafficTargetStatus
	for i, e := range w.shape {
		cfg := fmt.Sprintf("c%d", e.config)
		var t tt
		if e.pinned > 0 {
			t = pinned(fmt.Sprintf("%s-%05d", cfg, e.pinned), e.pct)
		} else {
			t = latest(cfg, fmt.Sprintf("%s-%05d", cfg, w.latest[e.config]), e.pct)
		}
		if e.tag {
			t = t.tagged(fmt.Sprintf("t%d", i))
		}
		out = append(out, servingv1alpha1.TrafficTargetStatus(t))
	}
	return out
}

var durations = []time.Duration{0, 500 * time.Millisecond, 10 * time.Second, 60 * time.Second, 120 * time.Second, 300 * time.Second, time.Hour}

func TestStepProperties(t *testing.T) {
	seeds := uint64(300)
	if testing.Short() {
		seeds = 30
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			w := &world{r: rand.New(rand.NewPCG(seed, 42)), latest: make([]int, 1+int(seed%3))}
			for i := range w.latest {
				w.latest[i] = 1
			}
			w.reshape()
			duration := durations[w.r.IntN(len(durations))]
			now := t0
			var prev *State
			check := func(what string, goal []servingv1alpha1.TrafficTargetStatus, inEffect bool) Result {
				t.Helper()
				goalBefore, prevBefore := deepCopy(goal), prev.clone()
				res := Step(prev, goal, now, duration, inEffect)
				if diff := cmp.Diff(goalBefore, goal); diff != "" {
					t.Fatalf("%s: Step changed its goal (-before +after):\n%s", what, diff)
				}
				if diff := cmp.Diff(prevBefore, prev); diff != "" {
					t.Fatalf("%s: Step changed its previous state (-before +after):\n%s", what, diff)
				}
				checkResult(t, what, prev, goal, now, res)
				prev = res.State
				return res
			}
			for i := range 40 {
				now = now.Add(time.Duration(w.r.IntN(90_000)) * time.Millisecond)
				switch k := w.r.IntN(20); {
				case k < 5:
					w.latest[w.r.IntN(len(w.latest))]++
				case k < 7:
					w.reshape()
				case k < 8:
					duration = durations[w.r.IntN(len(durations))]
				}
				check(fmt.Sprintf("call %d at %v, duration %v", i, now.Sub(t0), duration), w.goal(), w.r.IntN(5) > 0)
			}
			// No more changes: the rollout must finish, at the goal.
			goal := w.goal()
			for i := 0; ; i++ {
				res := check(fmt.Sprintf("finishing call %d", i), goal, true)
				if !res.InProgress {
					break
				}
				if i > 250 {
					t.Fatalf("rollout not done after %d calls: %+v", i, res.State)
				}
				if next := res.NextStep; next.IsZero() {
					now = now.Add(time.Second)
				} else {
					now = next
				}
			}
		})
	}
}

// checkResult checks what must hold after every call.
func checkResult(t *testing.T, what string, prev *State, goal []servingv1alpha1.TrafficTargetStatus, now time.Time, res Result) {
	t.Helper()
	for _, e := range res.Traffic {
		if e.Percent == nil || *e.Percent < 0 {
			t.Fatalf("%s: entry %+v has no or a negative percent", what, e)
		}
	}
	if got, want := sum(res.Traffic), sum(goal); got != want {
		t.Fatalf("%s: Traffic sums to %d, the goal to %d:\n%+v", what, got, want, res.Traffic)
	}
	for host, ss := range res.Splits {
		total := 0
		for _, s := range ss {
			if s.Percent <= 0 {
				t.Fatalf("%s: Splits[%q] has %+v", what, host, s)
			}
			total += s.Percent
		}
		if total != 100 {
			t.Fatalf("%s: Splits[%q] sums to %d: %+v", what, host, total, ss)
		}
	}
	if err := res.State.validate(); err != nil {
		t.Fatalf("%s: state does not validate: %v", what, err)
	}
	enc, err := Encode(res.State)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := Decode(enc)
	if err != nil {
		t.Fatalf("%s: Decode(Encode(state)): %v", what, err)
	}
	if diff := cmp.Diff(res.State, dec); diff != "" && len(res.State.Groups) > 0 {
		t.Fatalf("%s: state round trip (-want +got):\n%s", what, diff)
	}
	rolling := false
	for _, g := range res.State.Groups {
		rolling = rolling || g.rolling()
	}
	if rolling != res.InProgress {
		t.Fatalf("%s: InProgress = %v with groups %+v", what, res.InProgress, res.State.Groups)
	}
	if !res.NextStep.IsZero() && !res.NextStep.After(now) {
		t.Fatalf("%s: NextStep %v is not after now %v", what, res.NextStep, now)
	}
	// The newest revision of a group never loses traffic while its goal
	// percent stays.
	if prev != nil {
		for _, g := range res.State.Groups {
			p := prev.group(g.Tag, g.Configuration)
			if p == nil || p.Percent != g.Percent || len(p.Revisions) == 0 || len(g.Revisions) == 0 {
				continue
			}
			pn, gn := p.Revisions[len(p.Revisions)-1], g.Revisions[len(g.Revisions)-1]
			if pn.RevisionName == gn.RevisionName && gn.Percent < pn.Percent {
				t.Fatalf("%s: group %s/%s: newest %s went from %d to %d %%", what, g.Tag, g.Configuration, gn.RevisionName, pn.Percent, gn.Percent)
			}
		}
	}
	// Settled, the split is the goal's.
	if !res.InProgress {
		settled := Step(nil, goal, now, 0, true)
		if diff := cmp.Diff(settled.Traffic, res.Traffic); diff != "" {
			t.Fatalf("%s: settled Traffic is not the goal's (-want +got):\n%s", what, diff)
		}
		if diff := cmp.Diff(settled.Splits, res.Splits); diff != "" {
			t.Fatalf("%s: settled Splits are not the goal's (-want +got):\n%s", what, diff)
		}
	}
}

func deepCopy(ts []servingv1alpha1.TrafficTargetStatus) []servingv1alpha1.TrafficTargetStatus {
	out := make([]servingv1alpha1.TrafficTargetStatus, len(ts))
	for i, t := range ts {
		t.LatestRevision = ptr.To(isTrue(t.LatestRevision))
		t.Percent = ptr.To(int64(percent(t.Percent)))
		out[i] = t
	}
	return out
}
