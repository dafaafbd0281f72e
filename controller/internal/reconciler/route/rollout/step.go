package rollout

import (
	"math"
	"time"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

// Result is the split in effect at one moment of a rollout.
type Result struct {
	// Traffic is status.traffic: the goal's entries in order (entries
	// with the same tag, revision and latestRevision merged, as Knative's
	// status does), each latest-revision entry of a rolling configuration
	// expanded into one entry per revision, oldest first, every piece
	// keeping the entry's tag, URL, configurationName and latestRevision.
	// Percents are never nil and sum to the goal's total (100 for a
	// valid spec): they are shares of the Route's own host.
	Traffic []servingv1alpha1.TrafficTargetStatus
	// Splits is what each host serves, as Knative's Ingress does: key ""
	// the Route's own host (the same shares as Traffic, one entry per
	// revision), each tag's key its host, where the tagged target has
	// 100 % and rolls out on its own.
	Splits map[string][]Share
	// State is to be kept (Encode) and passed to the next call. Never
	// nil: a settled state is what the next new revision rolls from.
	State *State
	// NextStep is when a step is due and Step should run again; zero
	// when none is scheduled. A rollout whose first 1 % has not yet been
	// seen in effect has no NextStep: call again when it is.
	NextStep time.Time
	// InProgress is true while any group, on any host, still moves: the
	// Route's Ready is then Unknown with reason RolloutInProgress.
	InProgress bool
}

// Step returns the split in effect at now, Knative's gradual rollout.
//
// prev is the State of the previous call, nil when there is none (first
// reconcile, or an annotation Decode rejected): the goal then holds at
// once. goal is the spec resolved: pinned targets with RevisionName,
// configuration targets with ConfigurationName, the configuration's
// latest ready RevisionName and LatestRevision true; Percent nil is 0.
// duration is rollout-duration; Knative counts it in whole seconds, so
// anything under 1s is 0, which turns rollouts off: the goal holds at
// once, even in the middle of a rollout.
//
// prevInEffect says that the split prev describes is in effect on every
// node (Knative: its Ingress is Ready). The first call with it true after
// a new revision got its 1 % fixes the pace: with m the time since then
// rounded up to whole seconds (at least 1s), the rest of the group's
// percent p moves in steps of round((p-1)/n) every (duration-m)/n, where
// n = min(p-1, max(1, (duration-m)/m)) and duration-m is at least 1s;
// see plan for worked numbers. Steps then follow the clock alone, one
// per call at most, the next timed from the call that made it.
func Step(prev *State, goal []servingv1alpha1.TrafficTargetStatus, now time.Time, duration time.Duration, prevInEffect bool) Result {
	hosts := hostTargets(goal)
	cur := settledState(hosts)
	eff, next := cur, int64(0)
	if secs := int64(duration / time.Second); secs > 0 {
		p := prev.clone()
		if p != nil {
			sortGroups(p.Groups)
			if prevInEffect {
				for i := range p.Groups {
					p.Groups[i].observeInEffect(now.UnixNano(), float64(secs))
				}
			}
		}
		eff, next = advance(cur, p, now.UnixNano())
	}
	res := Result{State: eff}
	for i := range eff.Groups {
		if eff.Groups[i].rolling() {
			res.InProgress = true
		}
	}
	if next > 0 {
		res.NextStep = time.Unix(0, next).UTC()
	}
	res.Traffic = statusTraffic(goal, eff, res.InProgress)
	res.Splits = splits(hosts, eff)
	return res
}

// advance merges the goal's settled state with the previous one, group by
// group (Knative's Rollout.Step), and returns the state in effect and the
// earliest step due (0: none). Both states are sorted by tag, then
// configuration.
func advance(cur, prev *State, now int64) (*State, int64) {
	if prev == nil || len(prev.Groups) == 0 {
		return cur, 0
	}
	curByTag, prevByTag := byTag(cur.Groups), byTag(prev.Groups)
	out := &State{}
	next := int64(math.MaxInt64)
	for _, tag := range tagsInOrder(cur.Groups) {
		cs := curByTag[tag]
		ps, ok := prevByTag[tag]
		if !ok {
			// A host new to the state (a tag just added, or no
			// configuration had any share of the Route's host before):
			// Knative keeps only the first group of such a host; the
			// others join at the next call, still without a rollout.
			out.Groups = append(out.Groups, cs[0])
			continue
		}
		// Both lists are sorted by configuration: walk them together.
		for i, j := 0, 0; i < len(cs); {
			switch {
			case j >= len(ps) || cs[i].Configuration < ps[j].Configuration:
				// A configuration new to this host: nothing to roll from.
				out.Groups = append(out.Groups, cs[i])
				i++
			case cs[i].Configuration > ps[j].Configuration:
				// A configuration removed from this host: forgotten.
				j++
			default:
				switch {
				case cs[i].Percent > 1:
					g := stepGroup(cs[i], ps[j], now)
					if n := g.Timing.NextStepUnixNano; n > 0 && n < next {
						next = n
					}
					out.Groups = append(out.Groups, g)
				case cs[i].Percent == 1:
					// 1 % cannot be split: the new revision takes it.
					out.Groups = append(out.Groups, cs[i])
				}
				i++
				j++
			}
		}
	}
	sortGroups(out.Groups)
	if next == math.MaxInt64 {
		next = 0
	}
	return out, next
}

// stepGroup is one group's move: goal has the single current latest
// revision at the goal percent; prev (a copy, changed here) is the
// group's previous state.
func stepGroup(goal, prev Group, now int64) Group {
	out := Group{Configuration: goal.Configuration, Tag: goal.Tag, Percent: goal.Percent, Revisions: goal.Revisions}
	if len(prev.Revisions) > 0 {
		prev.Revisions = resize(prev.Revisions, prev.Percent, goal.Percent)
	}
	newest := goal.Revisions[0].RevisionName
	// Compared with the newest previous revision after the resize, which
	// never removes it. (Knative indexes with the count before the resize
	// and panics when a cut emptied the oldest revision.)
	if len(prev.Revisions) == 0 || prev.Revisions[len(prev.Revisions)-1].RevisionName == newest {
		// No new revision. A rollout in progress carries on (once its
		// pace is known); a settled group stays as the goal says.
		if prev.rolling() {
			out.Revisions, out.Timing = prev.Revisions, prev.Timing
			// A goal cut below the step (60 % with steps of 20, now 15 %)
			// leaves Knative a step larger than its group, a state its
			// own validation rejects at the next reconcile, so the
			// rollout jumps to the goal then. A step of the whole group
			// moves the same way (all that is left, at the next step)
			// and keeps the state valid.
			out.Timing.StepPercent = min(out.Timing.StepPercent, out.Percent)
			if out.Timing.StepPercent > 0 {
				out.stepRevisions(now)
			}
		}
		return out
	}
	// A new latest revision: it gets 1 % at once, taken from the newest
	// revision that still has a share (so an unfinished rollout gives
	// first and older ones drain later), e.g. [A 95, B 5] + C gives
	// [A 95, B 4, C 1]. Its pace is set once that 1 % is in effect.
	for i := len(prev.Revisions) - 1; i >= 0; i-- {
		if prev.Revisions[i].Percent > 0 {
			prev.Revisions[i].Percent--
			break
		}
	}
	revs := make([]Share, 0, len(prev.Revisions)+1)
	for _, r := range prev.Revisions {
		if r.Percent > 0 {
			revs = append(revs, r)
		}
	}
	out.Revisions = append(revs, Share{RevisionName: newest, Percent: 1})
	out.Timing = Timing{StartUnixNano: now}
	return out
}

// resize fits a group's revisions to a new goal percent: an increase all
// goes to the newest revision, a decrease is taken from the oldest first
// and drops those it empties. [A 21, B 54] from 75 to 42 % loses 33: A's
// 21 and 12 of B, leaving [B 42]. The newest always keeps at least 1 %,
// since the goal is above 1 % here.
func resize(revs []Share, from, to int) []Share {
	switch diff := to - from; {
	case to == 0:
		return nil
	case diff > 0:
		revs[len(revs)-1].Percent += diff
	case diff < 0:
		cut := -diff
		i := 0
		for ; cut > 0 && i < len(revs); i++ {
			if revs[i].Percent > cut {
				revs[i].Percent -= cut
				break
			}
			cut -= revs[i].Percent
		}
		return revs[i:]
	}
	return revs
}

// stepRevisions moves one step to the newest revision if it is due,
// taking it from the next-newest revisions first (an unfinished older
// rollout drains newest to oldest): [A 22, B 5, C 3, D 60] with a step
// of 10 takes C's 3, B's 5 and 2 of A, giving [A 20, D 70]. The newest
// never exceeds the group (the goal may have shrunk below a step).
func (g *Group) stepRevisions(now int64) {
	if now < g.Timing.NextStepUnixNano || !g.rolling() {
		return
	}
	last := len(g.Revisions) - 1
	newest := g.Revisions[last]
	left := g.Timing.StepPercent
	keep := last // revisions [0, keep) keep a share
	for i := last - 1; i >= 0 && left > 0; i-- {
		if g.Revisions[i].Percent > left {
			g.Revisions[i].Percent -= left
			break
		}
		left -= g.Revisions[i].Percent
		keep = i
	}
	newest.Percent = min(newest.Percent+g.Timing.StepPercent, g.Percent)
	g.Revisions = append(g.Revisions[:keep], newest)
	if g.rolling() {
		g.Timing.NextStepUnixNano = now + g.Timing.StepNanos
	} else {
		g.Timing = Timing{}
	}
}

// observeInEffect fixes the pace of a rollout whose first 1 % has just
// been seen in effect (Knative's ObserveReady); others are left as they
// are. The time that 1 % took, rounded up to whole seconds and at least
// 1s, is the shortest step: a cluster that needs 30s to apply a split
// gets 30s steps, not steps it cannot apply.
func (g *Group) observeInEffect(now int64, durationSecs float64) {
	if g.Timing.StepNanos != 0 || g.Timing.StartUnixNano <= 0 {
		return
	}
	took := time.Duration(now - g.Timing.StartUnixNano).Seconds()
	g.plan(float64(now), math.Max(1, math.Ceil(took)), durationSecs)
}

// plan sets the step size and interval of a rollout whose first 1 % took
// minStepSecs (>= 1), in floating point as Knative does:
//
//	rest     = max(1, duration - minStep)      time left after the first 1 %
//	steps    = min(percent - 1, max(1, rest / minStep))   not rounded
//	size     = round((percent - 1) / steps)    percent per step
//	interval = rest / steps                    (= minStep unless capped)
//	next     = now + interval
//
// Issue's example: 55 %, duration 120s, first 1 % in effect after 30s:
// rest = 90s, steps = 3, size = round(54/3) = 18, interval 30s, so the
// new revision has 1 % at 0s, 19 at 60s, 37 at 90s, 55 at 120s.
// 100 %, 120s, 2.4s: minStep 3s, rest 117s, steps 39, size
// round(99/39 = 2.54) = 3, interval 3s: 100 % after 33 steps, at
// 3 + 33*3 = 102s (flooring would make a step of 1.9 one of 1 and the
// rollout up to twice as long). 13 %, 120s, 200s: rest = 1s, steps 1, size 12, one step 1s
// later. 100 %, 120s, under 1s: minStep 1s, rest 119s, 119 steps capped
// at 99 of 1 %, interval 119/99 = 1.202020202s.
func (g *Group) plan(now, minStepSecs, durationSecs float64) {
	rest := math.Max(1, durationSecs-minStepSecs)
	steps := math.Max(1, rest/minStepSecs)
	left := float64(g.Percent - 1)
	if left < steps {
		steps = left
	}
	size := float64(g.Percent) // a group under 2 % (not from Step) moves at once
	if steps > 0 {
		size = math.Round(left / steps)
	} else {
		steps = 1
	}
	interval := rest / steps * float64(time.Second)
	g.Timing.StepNanos = int64(interval)
	g.Timing.StepPercent = int(size)
	// Summed in float64 as Knative does, so the result is rounded to
	// float64's precision at today's Unix nanoseconds (256ns).
	g.Timing.NextStepUnixNano = int64(now + interval)
}

// byTag groups a sorted slice of groups by tag, keeping the order.
func byTag(gs []Group) map[string][]Group {
	out := make(map[string][]Group)
	for _, g := range gs {
		out[g.Tag] = append(out[g.Tag], g)
	}
	return out
}

// tagsInOrder lists the tags of sorted groups, each once.
func tagsInOrder(gs []Group) []string {
	var out []string
	for i, g := range gs {
		if i == 0 || gs[i-1].Tag != g.Tag {
			out = append(out, g.Tag)
		}
	}
	return out
}
