package rollout

import (
	"slices"

	"k8s.io/utils/ptr"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

// target is one backend of a host before any rollout: a goal entry, or
// several with the same revision merged.
type target struct {
	revision, configuration string
	latest                  bool
	percent                 int
}

// hostTargets lays the goal out per host as Knative's traffic config
// does. The Route's own host ("") has every entry, tagged or not; entries
// with the same revision are merged into the first, percents added, so
// "latest 55 % + pinned config-00005 45 %" while config-00005 is the
// latest is one latest target of 100 % (and pinned first, one pinned
// target: that configuration then does not roll out, as in Knative). Each
// tag's host has its one entry, at 100 %: a host with a single backend
// sends it everything.
func hostTargets(goal []servingv1alpha1.TrafficTargetStatus) map[string][]target {
	raw := make(map[string][]target)
	for _, e := range goal {
		t := target{revision: e.RevisionName, configuration: e.ConfigurationName, latest: isTrue(e.LatestRevision), percent: percent(e.Percent)}
		raw[""] = append(raw[""], t)
		if e.Tag != "" {
			raw[e.Tag] = append(raw[e.Tag], t)
		}
	}
	out := make(map[string][]target, len(raw))
	for host, ts := range raw {
		var merged []target
		for _, t := range ts {
			if i := slices.IndexFunc(merged, func(m target) bool { return m.revision == t.revision }); i >= 0 {
				merged[i].percent += t.percent
				continue
			}
			merged = append(merged, t)
		}
		if len(merged) == 1 {
			merged[0].percent = 100
		}
		out[host] = merged
	}
	return out
}

// settledState is the state if the goal held now: one group per latest
// target with a share, its revision having all of it.
func settledState(hosts map[string][]target) *State {
	s := &State{}
	for host, ts := range hosts {
		for _, t := range ts {
			if !t.latest || t.percent == 0 {
				continue
			}
			s.Groups = append(s.Groups, Group{
				Configuration: t.configuration, Tag: host, Percent: t.percent,
				Revisions: []Share{{RevisionName: t.revision, Percent: t.percent}},
			})
		}
	}
	sortGroups(s.Groups)
	return s
}

// group finds the state's group of a configuration on a host.
func (s *State) group(host, configuration string) *Group {
	for i := range s.Groups {
		if g := &s.Groups[i]; g.Tag == host && g.Configuration == configuration {
			return g
		}
	}
	return nil
}

// splits is each host's backends with their percents, a revision once.
func splits(hosts map[string][]target, s *State) map[string][]Share {
	out := make(map[string][]Share, len(hosts))
	for host, ts := range hosts {
		var shares []Share
		add := func(sh Share) {
			if sh.Percent <= 0 {
				return
			}
			if i := slices.IndexFunc(shares, func(x Share) bool { return x.RevisionName == sh.RevisionName }); i >= 0 {
				shares[i].Percent += sh.Percent
				return
			}
			shares = append(shares, sh)
		}
		for _, t := range ts {
			if g := s.group(host, t.configuration); t.latest && g != nil && g.rolling() {
				for _, r := range g.Revisions {
					add(r)
				}
				continue
			}
			add(Share{RevisionName: t.revision, Percent: t.percent})
		}
		out[host] = shares
	}
	return out
}

// statusTraffic is Result.Traffic. Entries with the same tag, revision
// and latestRevision are merged first (Knative's status does). While the
// Route's host rolls a configuration, the entries that resolved to its
// newest revision share the group's revisions in order: each takes,
// oldest revision first, up to its own percent and the last takes what
// is left. One entry "latest 100 %" with [A 81, B 19] becomes A 81 and
// B 19; "latest 90 %" then "tag x, latest 10 %" becomes A 81, B 9, and
// x: B 10. An entry left with nothing shows its revision at 0 %.
//
// Knative shows a tagged latest entry as its tag host's rollout instead
// (summing to 100 % whatever the entry's percent); sockscale's agents and
// activator add up status.traffic's percents for the Route's host, so
// here every percent is a share of the Route's host; the tag hosts'
// splits are in Result.Splits.
func statusTraffic(goal []servingv1alpha1.TrafficTargetStatus, s *State, inProgress bool) []servingv1alpha1.TrafficTargetStatus {
	var entries []servingv1alpha1.TrafficTargetStatus
	for _, e := range goal {
		i := slices.IndexFunc(entries, func(x servingv1alpha1.TrafficTargetStatus) bool {
			return x.Tag == e.Tag && x.RevisionName == e.RevisionName && isTrue(x.LatestRevision) == isTrue(e.LatestRevision)
		})
		if i >= 0 {
			*entries[i].Percent += int64(percent(e.Percent))
			continue
		}
		e.Percent = ptr.To(int64(percent(e.Percent)))
		e.LatestRevision = ptr.To(isTrue(e.LatestRevision))
		entries = append(entries, e)
	}
	if !inProgress {
		return entries
	}
	pieces := make(map[int][]Share) // entry index -> its shares
	for gi := range s.Groups {
		g := &s.Groups[gi]
		if g.Tag != "" || !g.rolling() {
			continue
		}
		newest := g.Revisions[len(g.Revisions)-1].RevisionName
		var owners []int
		for i, e := range entries {
			if e.RevisionName == newest {
				owners = append(owners, i)
			}
		}
		queue := slices.Clone(g.Revisions)
		for k, i := range owners {
			want := int(*entries[i].Percent)
			for len(queue) > 0 && (want > 0 || k == len(owners)-1) {
				take := queue[0]
				if k < len(owners)-1 && take.Percent > want {
					take.Percent = want
				}
				queue[0].Percent -= take.Percent
				want -= take.Percent
				if queue[0].Percent == 0 {
					queue = queue[1:]
				}
				if take.Percent > 0 {
					pieces[i] = append(pieces[i], take)
				}
			}
			if len(pieces[i]) == 0 {
				pieces[i] = []Share{} // nothing left: the entry shows 0 %
			}
		}
	}
	out := make([]servingv1alpha1.TrafficTargetStatus, 0, len(entries)+len(s.Groups))
	for i, e := range entries {
		ps, ok := pieces[i]
		if !ok {
			out = append(out, e)
			continue
		}
		if len(ps) == 0 {
			e.Percent = ptr.To(int64(0))
			out = append(out, e)
			continue
		}
		for _, p := range ps {
			x := e
			x.RevisionName, x.Percent = p.RevisionName, ptr.To(int64(p.Percent))
			out = append(out, x)
		}
	}
	return out
}

func isTrue(b *bool) bool { return b != nil && *b }

func percent(p *int64) int {
	if p == nil {
		return 0
	}
	return int(*p)
}
