package rollout

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// AnnotationKey is where the route reconciler keeps the encoded State on
// the Route between reconciles.
const AnnotationKey = "serving.sockscale.dev/rollout"

// ErrInvalidState is wrapped by every error Decode returns: the caller
// then treats the annotation as absent (no rollout, goal at once) and
// says so.
var ErrInvalidState = errors.New("invalid rollout state")

// State is what Step needs from one call to the next: for every
// (configuration, tag) group that carries traffic, the revisions that
// share it and the timing of the rollout in progress. It is kept even
// when nothing rolls: it records which revision each group serves, and a
// new latest revision rolls out gradually only against a known previous
// one.
type State struct {
	// Groups are sorted by tag, then by configuration; a tag has at most
	// one group, the untagged host one per configuration.
	Groups []Group `json:"groups,omitempty"`
}

// Group is one configuration's share of one host's traffic: the Route's
// own host (Tag "") or a tag's host, where a tagged target has all 100 %.
type Group struct {
	Configuration string `json:"configuration"`
	Tag           string `json:"tag,omitempty"`
	// Percent is the group's share of its host; Revisions sum to it.
	Percent int `json:"percent"`
	// Revisions, oldest first. One when settled; during a rollout the
	// last is the newest and gains what the others lose.
	Revisions []Share `json:"revisions,omitempty"`
	// Timing of the rollout in progress, all zero when settled.
	Timing Timing `json:"timing,omitzero"`
}

// Share is a revision's part of a host's traffic, in percent of the
// whole host (not of its group).
type Share struct {
	RevisionName string `json:"revisionName"`
	Percent      int    `json:"percent"`
}

// Timing is when and by how much a group's rollout moves. Times are Unix
// nanoseconds, as in Knative's annotation, so the state is exact in JSON.
type Timing struct {
	// StartUnixNano is when the newest revision got its first 1 %.
	StartUnixNano int64 `json:"startUnixNano,omitempty"`
	// StepNanos is the time between steps; 0 until the first 1 % was
	// seen in effect, when the step size and interval are computed.
	StepNanos int64 `json:"stepNanos,omitempty"`
	// StepPercent is how much moves to the newest revision per step.
	StepPercent int `json:"stepPercent,omitempty"`
	// NextStepUnixNano is when the next step is due.
	NextStepUnixNano int64 `json:"nextStepUnixNano,omitempty"`
}

// rolling says whether a rollout is in progress: more than one revision
// still has a share.
func (g *Group) rolling() bool { return len(g.Revisions) > 1 }

// Encode returns the state as compact JSON for the annotation.
func Encode(s *State) (string, error) {
	if s == nil {
		s = &State{}
	}
	b, err := json.Marshal(s)
	if err != nil {
		return "", fmt.Errorf("encode rollout state: %w", err)
	}
	return string(b), nil
}

// Decode parses an annotation written by Encode and checks that it is a
// state Step can continue from. An empty string is no state (nil, nil).
// Any error wraps ErrInvalidState and names what is wrong.
func Decode(s string) (*State, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var st State
	if err := json.Unmarshal([]byte(s), &st); err != nil {
		return nil, fmt.Errorf("%w: not JSON of a rollout state: %w", ErrInvalidState, err)
	}
	if err := st.validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidState, err)
	}
	sortGroups(st.Groups)
	return &st, nil
}

// validate rejects what Knative's Validate rejects (a group over 100 %, a
// step size below 0 or above the group, revisions not summing to the
// group) and also what Step could not continue from sensibly: missing
// names, negative shares or times, two groups for one (configuration,
// tag), a rollout in a group under 2 % (its first step would be 0/0).
func (s *State) validate() error {
	seen := make(map[[2]string]bool, len(s.Groups))
	for i := range s.Groups {
		g := &s.Groups[i]
		where := fmt.Sprintf("groups[%d] (configuration %q, tag %q)", i, g.Configuration, g.Tag)
		key := [2]string{g.Tag, g.Configuration}
		switch {
		case g.Configuration == "":
			return fmt.Errorf("%s: configuration is empty", where)
		case seen[key]:
			return fmt.Errorf("%s: a second group for the same configuration and tag", where)
		case g.Percent < 0 || g.Percent > 100:
			return fmt.Errorf("%s: percent %d is outside 0..100", where, g.Percent)
		case g.Timing.StepPercent < 0 || g.Timing.StepPercent > g.Percent:
			return fmt.Errorf("%s: stepPercent %d is outside 0..%d (the group's percent)", where, g.Timing.StepPercent, g.Percent)
		case g.Timing.StartUnixNano < 0 || g.Timing.StepNanos < 0 || g.Timing.NextStepUnixNano < 0:
			return fmt.Errorf("%s: negative time in timing %+v", where, g.Timing)
		case g.Timing.NextStepUnixNano > 0 && (g.Timing.StepNanos == 0 || g.Timing.StepPercent == 0):
			// Only a planned pace sets a step's time (plan): a step due
			// without one would be due again at once, forever.
			return fmt.Errorf("%s: a step due at %d without a pace (stepNanos %d, stepPercent %d)", where, g.Timing.NextStepUnixNano, g.Timing.StepNanos, g.Timing.StepPercent)
		case g.rolling() && g.Percent < 2:
			return fmt.Errorf("%s: %d revisions share %d %%; a rollout needs at least 2 %%", where, len(g.Revisions), g.Percent)
		}
		seen[key] = true
		sum := 0
		for j, r := range g.Revisions {
			switch {
			case r.RevisionName == "":
				return fmt.Errorf("%s: revisions[%d]: revisionName is empty", where, j)
			case r.Percent < 0 || r.Percent > 100:
				return fmt.Errorf("%s: revisions[%d] (%q): percent %d is outside 0..100", where, j, r.RevisionName, r.Percent)
			}
			sum += r.Percent
		}
		if sum != g.Percent {
			return fmt.Errorf("%s: revisions sum to %d %%, not the group's %d %%", where, sum, g.Percent)
		}
	}
	return nil
}

// clone returns a deep copy: Step changes its copy of the previous state.
func (s *State) clone() *State {
	if s == nil {
		return nil
	}
	out := &State{Groups: slices.Clone(s.Groups)}
	for i := range out.Groups {
		out.Groups[i].Revisions = slices.Clone(out.Groups[i].Revisions)
	}
	return out
}

// sortGroups orders groups by tag, then configuration, the order Knative
// keeps and its merge of previous and current state relies on.
func sortGroups(gs []Group) {
	slices.SortStableFunc(gs, func(a, b Group) int {
		if c := strings.Compare(a.Tag, b.Tag); c != 0 {
			return c
		}
		return strings.Compare(a.Configuration, b.Configuration)
	})
}
