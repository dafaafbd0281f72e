package service

import (
	"sort"
	"time"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/config"
)

// Collect returns the Revisions of svc (revs are the ones it controls)
// that garbage collection deletes at now, by Knative's policy (config.GC),
// and when to look again (zero: nothing will age into collection).
//
// Only reserve Revisions count (no Route sends them traffic), never the
// latest created or ready, nor one annotated serving.knative.dev/no-gc:
// "true". Sorted by when they were last routed, newest first: the first
// MinNonActive stay. Of the rest, one is stale when created more than
// RetainSinceCreate ago and unrouted for more than RetainSinceLastActive
// (a disabled limit never passes; both disabled: nothing is stale); stale
// ones go. If more than MaxNonActive remain, the oldest beyond it go too.
// Example: min 2, max 3, 48h/15h, six reserve Revisions of which the
// third and fourth newest are stale: keep 1-2, delete 3-4, keep 5 (3rd
// remaining), delete 6 (4th remaining, beyond max 3).
func Collect(svc *servingv1alpha1.Service, revs []servingv1alpha1.Revision, gc config.GC, now time.Time) (doomed []string, next time.Time) {
	var candidates []*servingv1alpha1.Revision
	for i := range revs {
		r := &revs[i]
		if r.Name == svc.Status.LatestCreatedRevisionName || r.Name == svc.Status.LatestReadyRevisionName ||
			r.Status.RoutingState != servingv1alpha1.RoutingStateReserve || r.Annotations[servingv1alpha1.NoGCAnnotation] == "true" ||
			r.DeletionTimestamp != nil {
			continue
		}
		candidates = append(candidates, r)
	}
	sort.SliceStable(candidates, func(i, j int) bool {
		a, b := lastActive(candidates[i]), lastActive(candidates[j])
		if !a.Equal(b) {
			return a.After(b)
		}
		return candidates[i].Name > candidates[j].Name
	})
	if len(candidates) <= int(gc.MinNonActive) {
		return nil, time.Time{}
	}
	kept := int(gc.MinNonActive)
	var remaining []*servingv1alpha1.Revision
	for _, r := range candidates[gc.MinNonActive:] {
		staleAt, ever := staleFrom(r, gc)
		switch {
		case ever && !now.Before(staleAt):
			doomed = append(doomed, r.Name)
			continue
		case ever && (next.IsZero() || staleAt.Before(next)):
			next = staleAt
		}
		kept++
		remaining = append(remaining, r)
	}
	if gc.MaxNonActive != config.Disabled && kept > int(gc.MaxNonActive) {
		over := kept - int(gc.MaxNonActive)
		for _, r := range remaining[len(remaining)-over:] {
			doomed = append(doomed, r.Name)
		}
	}
	return doomed, next
}

// lastActive is when a Revision was last routed: when its routing state
// last changed (to reserve), else its creation.
func lastActive(r *servingv1alpha1.Revision) time.Time {
	if r.Status.RoutingStateModified != nil {
		return r.Status.RoutingStateModified.Time
	}
	return r.CreationTimestamp.Time
}

// staleFrom is when r becomes stale; ever is false when it never will
// (both limits disabled).
func staleFrom(r *servingv1alpha1.Revision, gc config.GC) (time.Time, bool) {
	if gc.RetainSinceCreate == config.Disabled && gc.RetainSinceLastActive == config.Disabled {
		return time.Time{}, false
	}
	var at time.Time
	if gc.RetainSinceCreate != config.Disabled {
		at = r.CreationTimestamp.Add(gc.RetainSinceCreate)
	}
	if gc.RetainSinceLastActive != config.Disabled {
		if a := lastActive(r).Add(gc.RetainSinceLastActive); a.After(at) {
			at = a
		}
	}
	return at, true
}
