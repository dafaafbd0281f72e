package config

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

// Schedule is a PodAutoscaler's spec.minScaleSchedule, read: windows of a
// time zone in which min-scale is raised.
type Schedule struct {
	loc     *time.Location
	windows []scheduleWindow
}

// scheduleWindow is one window, its times in minutes from midnight.
type scheduleWindow struct {
	name       string
	days       [7]bool // by time.Weekday: the days it opens on
	start, end int     // end <= start: it closes the next day
	minScale   int32
	describe   string
}

// Window is the window that applies at a moment.
type Window struct {
	Name     string
	MinScale int32
	// Describe says when it applies, e.g. "Mon-Fri 08:00-18:00
	// Europe/Berlin".
	Describe string
}

// weekdays maps the API's day names to Go's.
var weekdays = map[v1alpha1.Weekday]time.Weekday{
	"Sun": time.Sunday, "Mon": time.Monday, "Tue": time.Tuesday, "Wed": time.Wednesday,
	"Thu": time.Thursday, "Fri": time.Friday, "Sat": time.Saturday,
}

// ParseSchedule reads s (nil: no schedule, nil). The API server has
// checked the fields; this checks them again (a client may skip
// validation against an old CRD) and names what is wrong.
func ParseSchedule(s *v1alpha1.MinScaleSchedule) (*Schedule, error) {
	if s == nil {
		return nil, nil
	}
	// "Local" would be the controller's own zone, which a schedule must
	// never depend on; the empty name is UTC to Go, but not explicit.
	if s.TimeZone == "" || s.TimeZone == "Local" {
		return nil, fmt.Errorf("minScaleSchedule.timeZone %q: must be an IANA time zone name such as Europe/Berlin, or UTC", s.TimeZone)
	}
	loc, err := time.LoadLocation(s.TimeZone)
	if err != nil {
		return nil, fmt.Errorf("minScaleSchedule.timeZone %q: must be an IANA time zone name such as Europe/Berlin, or UTC: %w", s.TimeZone, err)
	}
	if len(s.Windows) == 0 {
		return nil, errors.New("minScaleSchedule.windows: needs at least one window")
	}
	sch := &Schedule{loc: loc}
	seen := map[string]bool{}
	var errs []error
	for i, w := range s.Windows {
		field := fmt.Sprintf("minScaleSchedule.windows[%d]", i)
		if w.Name == "" || seen[w.Name] {
			errs = append(errs, fmt.Errorf("%s.name %q: must be set and unique", field, w.Name))
		}
		seen[w.Name] = true
		sw := scheduleWindow{name: w.Name, minScale: w.MinScale}
		if w.MinScale < 1 {
			errs = append(errs, fmt.Errorf("%s.minScale %d: must be 1 or more", field, w.MinScale))
		}
		var bad bool
		if sw.start, bad = minutesOf(w.Start, false); bad {
			errs = append(errs, fmt.Errorf("%s.start %q: must be HH:MM from 00:00 to 23:59", field, w.Start))
		}
		if sw.end, bad = minutesOf(w.End, true); bad {
			errs = append(errs, fmt.Errorf("%s.end %q: must be HH:MM from 00:00 to 24:00", field, w.End))
		}
		if sw.start == sw.end { // 00:00-24:00 is the whole day
			errs = append(errs, fmt.Errorf("%s: start %s and end %s must differ (an end before the start closes the window the next day)", field, w.Start, w.End))
		}
		var names []string
		for _, d := range w.Days {
			wd, ok := weekdays[d]
			if !ok {
				errs = append(errs, fmt.Errorf("%s.days: %q is not one of Mon, Tue, Wed, Thu, Fri, Sat, Sun", field, d))
				continue
			}
			sw.days[wd] = true
			names = append(names, string(d))
		}
		if len(w.Days) == 0 {
			sw.days = [7]bool{true, true, true, true, true, true, true}
			names = []string{"daily"}
		}
		sw.describe = fmt.Sprintf("%s %s-%s %s", strings.Join(names, ","), w.Start, w.End, s.TimeZone)
		sch.windows = append(sch.windows, sw)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return sch, nil
}

// minutesOf reads HH:MM as minutes from midnight; 24:00 only if allow24.
// bad says it is no such time.
func minutesOf(s string, allow24 bool) (minutes int, bad bool) {
	if allow24 && s == "24:00" {
		return 24 * 60, false
	}
	t, err := time.Parse("15:04", s)
	if err != nil || len(s) != 5 {
		return 0, true
	}
	return t.Hour()*60 + t.Minute(), false
}

// At is the window that applies at now, the one with the highest
// minScale if several do (the first listed of equals); false if none.
// A window that ends before it starts runs past midnight and belongs to
// the day it opened on: Fri 22:00-06:00 applies Friday night until
// Saturday 06:00. Times are the zone's wall clock, so a window keeps its
// hours across daylight saving changes (a local time skipped by one never
// comes that day).
func (s *Schedule) At(now time.Time) (Window, bool) {
	if s == nil {
		return Window{}, false
	}
	local := now.In(s.loc)
	minute := local.Hour()*60 + local.Minute()
	today, yesterday := local.Weekday(), (local.Weekday()+6)%7
	var best *scheduleWindow
	for i := range s.windows {
		w := &s.windows[i]
		var in bool
		if w.start < w.end {
			in = w.days[today] && minute >= w.start && minute < w.end
		} else {
			in = (w.days[today] && minute >= w.start) || (w.days[yesterday] && minute < w.end)
		}
		if in && (best == nil || w.minScale > best.minScale) {
			best = w
		}
	}
	if best == nil {
		return Window{}, false
	}
	return Window{Name: best.name, MinScale: best.minScale, Describe: best.describe}, true
}

// Raise applies the window of now to s: min-scale is at least its
// minScale. A window above max-scale, or above the cluster's
// max-scale-limit, is an error naming both (the API server keeps windows
// under the spec's own max-scale; an annotation or the cluster's may be
// lower). applies is false when no window applies.
func (s *Settings) Raise(c *Config, sch *Schedule, now time.Time) (w Window, applies bool, err error) {
	w, applies = sch.At(now)
	if !applies {
		return Window{}, false, nil
	}
	if s.MaxScale > 0 && w.MinScale > s.MaxScale {
		return w, true, fmt.Errorf("minScaleSchedule window %q (%s) raises min-scale to %d, above max-scale %d", w.Name, w.Describe, w.MinScale, s.MaxScale)
	}
	if c.MaxScaleLimit > 0 && w.MinScale > c.MaxScaleLimit {
		return w, true, fmt.Errorf("minScaleSchedule window %q (%s) raises min-scale to %d: the cluster's max-scale-limit %d allows at most %d", w.Name, w.Describe, w.MinScale, c.MaxScaleLimit, c.MaxScaleLimit)
	}
	s.MinScale = max(s.MinScale, w.MinScale)
	return w, true, nil
}
