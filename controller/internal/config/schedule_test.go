package config

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

func TestScheduleAt(t *testing.T) {
	sch, err := ParseSchedule(&v1alpha1.MinScaleSchedule{TimeZone: "Europe/Berlin", Windows: []v1alpha1.MinScaleWindow{
		{Name: "working-hours", Days: []v1alpha1.Weekday{"Mon", "Tue", "Wed", "Thu", "Fri"}, Start: "08:00", End: "18:00", MinScale: 3},
		{Name: "friday-night", Days: []v1alpha1.Weekday{"Fri"}, Start: "22:00", End: "06:00", MinScale: 2},
		{Name: "lunch-peak", Days: []v1alpha1.Weekday{"Mon", "Tue", "Wed", "Thu", "Fri"}, Start: "12:00", End: "13:30", MinScale: 6},
		{Name: "evening", Start: "18:00", End: "24:00", MinScale: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time {
		t.Helper()
		tm, err := time.ParseInLocation("2006-01-02 15:04", s, berlin)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	for _, tc := range []struct {
		name string
		now  time.Time
		want string // window name, "" none
	}{
		{"Monday 07:59", at("2026-11-30 07:59"), ""},
		{"Monday 08:00", at("2026-11-30 08:00"), "working-hours"},
		{"Monday 12:30: the highest of two", at("2026-11-30 12:30"), "lunch-peak"},
		{"Monday 17:59", at("2026-11-30 17:59"), "working-hours"},
		{"Monday 18:00: the next window", at("2026-11-30 18:00"), "evening"},
		{"Monday 23:59", at("2026-11-30 23:59"), "evening"},
		{"Tuesday 00:00: evening ended at midnight", at("2026-12-01 00:00"), ""},
		{"Friday 23:00: over midnight, highest", at("2026-12-04 23:00"), "friday-night"},
		{"Saturday 05:59: Friday's window still", at("2026-12-05 05:59"), "friday-night"},
		{"Saturday 06:00", at("2026-12-05 06:00"), ""},
		{"Saturday 10:00: not a working day", at("2026-12-05 10:00"), ""},
		{"Sunday 02:00: Saturday opened no night window", at("2026-12-06 02:00"), ""},
		// The zone's clock, not UTC's: 07:30 UTC is 08:30 in Berlin in winter.
		{"Monday 07:30 UTC", time.Date(2026, 11, 30, 7, 30, 0, 0, time.UTC), "working-hours"},
		// Summer time: 06:30 UTC is 08:30 in Berlin.
		{"a summer Monday 06:30 UTC", time.Date(2026, 7, 6, 6, 30, 0, 0, time.UTC), "working-hours"},
	} {
		w, ok := sch.At(tc.now)
		if ok != (tc.want != "") || w.Name != tc.want {
			t.Errorf("%s: window %q (applies %v), want %q", tc.name, w.Name, ok, tc.want)
		}
	}
	if w, _ := sch.At(at("2026-11-30 09:00")); w.Describe != "Mon,Tue,Wed,Thu,Fri 08:00-18:00 Europe/Berlin" {
		t.Errorf("Describe = %q", w.Describe)
	}
	if w, _ := sch.At(at("2026-11-30 19:00")); w.Describe != "daily 18:00-24:00 Europe/Berlin" {
		t.Errorf("Describe = %q", w.Describe)
	}
	var none *Schedule
	if _, ok := none.At(at("2026-11-30 09:00")); ok {
		t.Errorf("no schedule: a window applies")
	}
}

func TestParseScheduleRefuses(t *testing.T) {
	w := func(edit func(*v1alpha1.MinScaleWindow)) []v1alpha1.MinScaleWindow {
		win := v1alpha1.MinScaleWindow{Name: "w", Start: "08:00", End: "18:00", MinScale: 1}
		edit(&win)
		return []v1alpha1.MinScaleWindow{win}
	}
	for _, tc := range []struct {
		name string
		s    v1alpha1.MinScaleSchedule
		want string
	}{
		{"no zone", v1alpha1.MinScaleSchedule{Windows: w(func(*v1alpha1.MinScaleWindow) {})}, `minScaleSchedule.timeZone "": must be an IANA time zone name`},
		{"the controller's zone", v1alpha1.MinScaleSchedule{TimeZone: "Local", Windows: w(func(*v1alpha1.MinScaleWindow) {})}, `minScaleSchedule.timeZone "Local"`},
		{"unknown zone", v1alpha1.MinScaleSchedule{TimeZone: "Europe/Atlantis", Windows: w(func(*v1alpha1.MinScaleWindow) {})}, `minScaleSchedule.timeZone "Europe/Atlantis"`},
		{"no window", v1alpha1.MinScaleSchedule{TimeZone: "UTC"}, "minScaleSchedule.windows: needs at least one window"},
		{"bad start", v1alpha1.MinScaleSchedule{TimeZone: "UTC", Windows: w(func(x *v1alpha1.MinScaleWindow) { x.Start = "8:00" })}, `minScaleSchedule.windows[0].start "8:00": must be HH:MM`},
		{"24:00 start", v1alpha1.MinScaleSchedule{TimeZone: "UTC", Windows: w(func(x *v1alpha1.MinScaleWindow) { x.Start = "24:00" })}, `minScaleSchedule.windows[0].start "24:00"`},
		{"empty window", v1alpha1.MinScaleSchedule{TimeZone: "UTC", Windows: w(func(x *v1alpha1.MinScaleWindow) { x.Start, x.End = "08:00", "08:00" })}, "start 08:00 and end 08:00 must differ"},
		{"bad day", v1alpha1.MinScaleSchedule{TimeZone: "UTC", Windows: w(func(x *v1alpha1.MinScaleWindow) { x.Days = []v1alpha1.Weekday{"Funday"} })}, `"Funday" is not one of Mon`},
		{"min-scale 0", v1alpha1.MinScaleSchedule{TimeZone: "UTC", Windows: w(func(x *v1alpha1.MinScaleWindow) { x.MinScale = 0 })}, "minScaleSchedule.windows[0].minScale 0: must be 1 or more"},
	} {
		_, err := ParseSchedule(&tc.s)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: ParseSchedule = %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

func TestSettingsRaise(t *testing.T) {
	sch, err := ParseSchedule(&v1alpha1.MinScaleSchedule{TimeZone: "UTC", Windows: []v1alpha1.MinScaleWindow{{Name: "day", Start: "08:00", End: "18:00", MinScale: 4}}})
	if err != nil {
		t.Fatal(err)
	}
	noon, night := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC), time.Date(2026, 11, 30, 22, 0, 0, 0, time.UTC)
	type result struct {
		MinScale int32
		Window   string
		Err      string
	}
	for _, tc := range []struct {
		name    string
		s       Settings
		c       Config
		now     time.Time
		want    result
		applies bool
	}{
		{"raised at noon", Settings{MinScale: 1, MaxScale: 10}, Config{}, noon, result{MinScale: 4, Window: "day"}, true},
		{"a higher min-scale stays", Settings{MinScale: 6}, Config{}, noon, result{MinScale: 6, Window: "day"}, true},
		{"not at night", Settings{MinScale: 1}, Config{}, night, result{MinScale: 1}, false},
		{"above max-scale", Settings{MinScale: 0, MaxScale: 3}, Config{}, noon, result{MinScale: 0, Window: "day", Err: `minScaleSchedule window "day" (daily 08:00-18:00 UTC) raises min-scale to 4, above max-scale 3`}, true},
		{"above the cluster's limit", Settings{}, Config{MaxScaleLimit: 2}, noon, result{Window: "day", Err: "the cluster's max-scale-limit 2 allows at most 2"}, true},
	} {
		s := tc.s
		w, applies, err := s.Raise(&tc.c, sch, tc.now)
		got := result{MinScale: s.MinScale, Window: w.Name}
		if err != nil {
			got.Err = err.Error()
			if strings.Contains(got.Err, tc.want.Err) {
				got.Err = tc.want.Err
			}
		}
		if diff := cmp.Diff(tc.want, got); diff != "" || applies != tc.applies {
			t.Errorf("%s: applies %v (want %v) (-want +got):\n%s", tc.name, applies, tc.applies, diff)
		}
	}
}
