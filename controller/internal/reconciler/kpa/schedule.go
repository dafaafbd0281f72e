package kpa

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
)

// parsedSchedule is a PodAutoscaler's minScaleSchedule, read once per
// generation: loading a time zone reads its rules from the zone database
// each time, and every target is decided every 2 s.
type parsedSchedule struct {
	generation int64
	schedule   *config.Schedule
	err        error
}

// raiseMinScale raises s's min-scale by pa's minScaleSchedule at now, and
// returns the name of the window that applies ("" none). A change of
// window is announced as an Event (the status shows the window in force:
// status.minScaleWindow, the Min Window column).
func (r *PodAutoscaler) raiseMinScale(key collector.Key, pa *v1alpha1.PodAutoscaler, s *config.Settings, now time.Time) (string, error) {
	if pa.Spec.MinScaleSchedule == nil {
		// Every tick of every target passes here: delete only what a
		// schedule removed from the spec left.
		if _, ok := r.schedules.Load(key); ok {
			r.schedules.Delete(key)
		}
		return "", nil
	}
	if s.Class == string(v1alpha1.ClassExternal) { // the API server refuses it only with the class in the spec
		return "", fmt.Errorf("minScaleSchedule does not apply to class %s (here from the pod template's annotation): the external autoscaler decides every count", v1alpha1.ClassExternal)
	}
	p, ok := r.schedules.Load(key)
	if !ok || p.(parsedSchedule).generation != pa.Generation {
		sch, err := config.ParseSchedule(pa.Spec.MinScaleSchedule)
		p = parsedSchedule{generation: pa.Generation, schedule: sch, err: err}
		r.schedules.Store(key, p)
	}
	parsed := p.(parsedSchedule)
	if parsed.err != nil {
		return "", parsed.err
	}
	before := s.MinScale
	w, applies, err := s.Raise(r.Config(), parsed.schedule, now)
	if err != nil {
		return "", err
	}
	switch was := pa.Status.MinScaleWindow; {
	case applies && w.Name != was:
		r.event(pa, corev1.EventTypeNormal, "MinScaleWindow", "Decide", "window %q (%s) applies: min-scale %d (from %d)", w.Name, w.Describe, s.MinScale, before)
	case !applies && was != "":
		r.event(pa, corev1.EventTypeNormal, "MinScaleWindow", "Decide", "window %q no longer applies: min-scale %d", was, s.MinScale)
	}
	return w.Name, nil
}
