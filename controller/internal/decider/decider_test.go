package decider

import (
	"math"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/controller/internal/config"
)

var t0 = time.Unix(1_700_000_000, 0)

// settings builds a target's settings from the defaults and a spec.
func settings(t testing.TB, cc int32, spec *config.Overrides) config.Settings {
	t.Helper()
	s, err := config.Effective(config.Defaults(), cc, nil, spec)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func in(ready int32, stable, panic float64) Inputs {
	return Inputs{ReadyPods: ready, Stable: stable, Panic: panic, HasData: true, Reachable: true}
}

func TestOneDecision(t *testing.T) {
	def := settings(t, 0, nil) // target value 70, TBC 211
	limited := settings(t, 0, nil)
	limited.MaxScaleUpRate = 2
	tests := []struct {
		name string
		s    config.Settings
		in   Inputs
		want int32
	}{
		{"stable 140 at target 70 => 2", def, in(1, 140, 140), 2},
		{"stable 141 => ceil(2.01) = 3", def, in(2, 141, 141), 3},
		{"idle and reachable: ready 4 may drop to floor(4/2) = 2", def, in(4, 0, 0), 2},
		{"idle and unreachable: straight to 0", def, Inputs{ReadyPods: 4, HasData: true}, 0},
		{"scale up rate 2 caps ready 3 at ceil(2*3) = 6", limited, in(3, 70*10, 70*3), 6},
		{"activation scale 5 lifts 1 to 5", settings(t, 0, &config.Overrides{ActivationScale: ptr.To(int32(5))}), in(0, 10, 10), 5},
		{"activation scale leaves 0 alone", settings(t, 0, &config.Overrides{ActivationScale: ptr.To(int32(5))}), Inputs{HasData: true}, 0},
		// Idle with 5 ready: the rate limit keeps floor(5/2) = 2, which is
		// not an activation (the raw count is 0) and must not be lifted
		// back to 5, or the target never scales down.
		{"activation scale lets an idle target scale down", settings(t, 0, &config.Overrides{ActivationScale: ptr.To(int32(5))}), in(5, 0, 0), 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := New(tt.s, 0, t0, logr.Discard(), "default/hello")
			got := d.Decide(t0, tt.in)
			if !got.Valid || got.DesiredScale != tt.want {
				t.Errorf("desired %d (valid %v), want %d", got.DesiredScale, got.Valid, tt.want)
			}
		})
	}
}

// TestNoDataNoDecision: before any data the decider wants nothing new
// (desired -1) and reports Knative's initial excess burst capacity,
// initialScale x total - TBC, truncated towards zero as Knative does.
func TestNoDataNoDecision(t *testing.T) {
	tests := []struct {
		name    string
		cc      int32
		spec    *config.Overrides
		wantEBC int32
	}{
		{"defaults: 1 x 100 - 211", 0, nil, -111},
		{"initial scale 3 of CC 10, TBC 7: 30 - 7", 10, &config.Overrides{InitialScale: ptr.To(int32(3)), TargetBurstCapacity: ptr.To(7.0)}, 23},
		{"TBC 0", 0, &config.Overrides{TargetBurstCapacity: ptr.To(0.0)}, 0},
		{"TBC -1", 0, &config.Overrides{TargetBurstCapacity: ptr.To(-1.0)}, -1},
		{"target 10.5, TBC 11: -0.5 truncates to 0", 0, &config.Overrides{Target: ptr.To(10.5), TargetBurstCapacity: ptr.To(11.0)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := settings(t, tt.cc, tt.spec)
			got := New(s, 0, t0, logr.Discard(), "default/hello").Decide(t0, Inputs{ReadyPods: 0})
			want := Decision{DesiredScale: -1, ExcessBurstCapacity: tt.wantEBC, Activators: Activators(s, 0)}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestExcessBurstCapacity(t *testing.T) {
	tests := []struct {
		tbc   float64
		ready int32
		panic float64
		want  int32
	}{
		{10, 3, 15.8, 4},   // 3*10 - 10 - 15.8 = 4.2 => 4
		{10, 1, 15.8, -16}, // 10 - 10 - 15.8 = -15.8 => -16
		{0, 3, 15.8, 0},    // no burst capacity wanted
		{-1, 30, 0, -1},    // activator always in the path
		{211, 10, 0, -111}, // default TBC with 10 pods of 10: 100 - 211
	}
	for _, tt := range tests {
		s := settings(t, 10, &config.Overrides{TargetBurstCapacity: ptr.To(tt.tbc)}) // total 10
		got := New(s, 0, t0, logr.Discard(), "default/hello").Decide(t0, in(tt.ready, tt.panic, tt.panic))
		if got.ExcessBurstCapacity != tt.want {
			t.Errorf("TBC %v ready %d panic %v: EBC %d, want %d", tt.tbc, tt.ready, tt.panic, got.ExcessBurstCapacity, tt.want)
		}
	}
}

func TestActivators(t *testing.T) {
	tests := []struct {
		cc    int32
		tbc   float64
		ready int32
		want  int32
	}{
		{0, 0, 50, 2},      // TBC 0, no CC: always 2 (in the path only at zero)
		{10, 0, 50, 5},     // CC: the activators carry all traffic, ceil(50 x 10 / 100)
		{10, 211, 0, 3},    // ceil(211/100)
		{10, 211, 5, 3},    // ceil((50+211)/100)
		{10, 211, 100, 10}, // ceil((1000+211)/100) = 13, at most CC 10
		{0, 211, 100, 103}, // no CC, no cap: ceil((100 x 100 + 211)/100)
		{10, -1, 100, 10},  // ceil(1000/100)
		{10, -1, 0, 2},     // at least 2
		{1, 211, 0, 1},     // CC 1: one activator owns every pod's slot
		{1, 0, 5, 1},       // ... even with TBC 0
		{2, 211, 0, 2},     // CC 2: a slot each at every pod
		{3, 211, 3, 3},     // ceil((3 x 2.1 + 211)/100) = 3, CC 3
	}
	for _, tt := range tests {
		s := settings(t, tt.cc, &config.Overrides{TargetBurstCapacity: ptr.To(tt.tbc)})
		if got := Activators(s, tt.ready); got != tt.want {
			t.Errorf("CC %d TBC %v ready %d: %d activators, want %d", tt.cc, tt.tbc, tt.ready, got, tt.want)
		}
	}
}

func TestPanicTimeline(t *testing.T) {
	s := settings(t, 0, nil) // target 70, threshold 2, stable window 60s
	d := New(s, 1, t0, logr.Discard(), "default/hello")
	at := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	steps := []struct {
		at        int
		in        Inputs
		want      int32
		panicking bool
	}{
		{0, in(1, 50, 50), 1, false},     // calm
		{2, in(1, 60, 280), 4, true},     // burst: 280/70 = 4 pods, 4/1 >= 2 => PANICKING
		{4, in(4, 80, 100), 4, true},     // calmer panic window: never below 4 in a panic
		{6, in(4, 300, 700), 10, true},   // over again (10/4 >= 2): up to 10, the panic extends
		{30, in(10, 100, 100), 10, true}, // still in panic: holds 10
		{65, in(10, 100, 100), 10, true}, // 59 s after the last time over: still panicking
		// Exactly a stable window after the last time over is not enough:
		// panic ends only when strictly more has passed (as in Knative).
		{66, in(10, 100, 100), 10, true},
		{67, in(10, 100, 100), 5, false}, // 61 s since: Un-panicking, floor(10/2)=5 is the rate limit
	}
	for _, st := range steps {
		got := d.Decide(at(st.at), st.in)
		if got.DesiredScale != st.want || got.Panicking != st.panicking {
			t.Fatalf("at %ds: desired %d panicking %v, want %d %v", st.at, got.DesiredScale, got.Panicking, st.want, st.panicking)
		}
	}
}

func TestRestartStartsInPanic(t *testing.T) {
	s := settings(t, 0, nil)
	d := New(s, 5, t0, logr.Discard(), "default/hello") // a busy target when the controller starts
	// Quiet first windows (a fresh collector) must not scale it down.
	if got := d.Decide(t0.Add(2*time.Second), in(5, 10, 10)); got.DesiredScale != 5 || !got.Panicking {
		t.Errorf("first decision after a restart: %d panicking %v, want 5 true", got.DesiredScale, got.Panicking)
	}
	if got := New(s, 1, t0, logr.Discard(), "default/hello").Decide(t0, in(1, 10, 10)); got.Panicking {
		t.Error("a target with one ready pod starts panicking")
	}
}

func TestScaleDownDelay(t *testing.T) {
	s := settings(t, 0, &config.Overrides{ScaleDownDelay: ptr.To(30 * time.Second)})
	s.MaxScaleDownRate = 1000 // let the delay alone hold the count
	d := New(s, 1, t0, logr.Discard(), "default/hello")
	at := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	steps := []struct {
		at   int
		in   Inputs
		want int32
	}{
		{0, in(1, 280, 50), 4},   // 4 pods (the panic window is calm)
		{10, in(4, 70, 70), 4},   // 1 wanted, 4 seen 10 s ago: hold 4
		{29, in(4, 70, 70), 4},   // 4 is 29 s old: hold
		{31, in(4, 70, 70), 1},   // 31 s: the 4 left the window
		{40, in(1, 140, 140), 2}, // up at once
	}
	for _, st := range steps {
		if got := d.Decide(at(st.at), st.in); got.DesiredScale != st.want {
			t.Fatalf("at %ds: desired %d, want %d", st.at, got.DesiredScale, st.want)
		}
	}
}

// TestScaleDownDelaySkippedWhileUnreachable: as in Knative, a target no
// traffic can reach is not held by the scale-down delay, and its ticks
// are not remembered by it.
func TestScaleDownDelaySkippedWhileUnreachable(t *testing.T) {
	s := settings(t, 0, &config.Overrides{ScaleDownDelay: ptr.To(30 * time.Second)})
	d := New(s, 1, t0, logr.Discard(), "default/hello")
	at := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	unreachable := func(ready int32, v float64) Inputs {
		return Inputs{ReadyPods: ready, Stable: v, Panic: v, HasData: true}
	}
	steps := []struct {
		at   int
		in   Inputs
		want int32
	}{
		{0, in(1, 280, 50), 4},      // reachable: 4 pods, remembered for 30 s
		{10, unreachable(4, 0), 0},  // unreachable and idle: 0 at once, no rate limit, no delay
		{12, unreachable(0, 70), 1}, // unreachable: 1 wanted, not remembered
		{14, in(1, 70, 70), 4},      // reachable again: the 4 of 0 s is 14 s old, held
		{32, in(4, 70, 70), 2},      // 4 left the delay: floor(4/2) = 2 is the rate limit
	}
	for _, st := range steps {
		if got := d.Decide(at(st.at), st.in); got.DesiredScale != st.want {
			t.Fatalf("at %ds: desired %d, want %d", st.at, got.DesiredScale, st.want)
		}
	}
}

// TestStepLoadStaysInBand replays the step load (docs/autoscaling.md, "The
// step-load band"): offered concurrency c steps up and the pod count
// follows, within [floor(c/v) - 1, ceil(ceil(c/v) * 1.1)] at every check,
// v being the target value (here target 10 x 0.7 = 7).
func TestStepLoadStaysInBand(t *testing.T) {
	s := settings(t, 0, &config.Overrides{Target: ptr.To(10.0)}) // target value 7
	d := New(s, 1, t0, logr.Discard(), "default/hello")
	ready := int32(1)
	now := t0
	for _, offered := range []float64{7, 14, 21, 28} {
		for range 30 { // 60 s at this step, a decision every 2 s
			now = now.Add(2 * time.Second)
			got := d.Decide(now, in(ready, offered, offered))
			ready = got.DesiredScale // pods start at once
		}
		wantPods := int32(math.Ceil(offered / 7))
		if ready < wantPods-1 || float64(ready) > math.Ceil(float64(wantPods)*1.1) {
			t.Errorf("offered %v: %d pods, want about %d", offered, ready, wantPods)
		}
	}
	if ready != 4 {
		t.Errorf("after the last step: %d pods, want 4", ready)
	}
}

// TestBurstCapacitySettlesAtTwo is the TBC=7, CC=10 scenario
// (docs/autoscaling.md, "Excess burst capacity"): steady
// load needing 2 pods settles at exactly 2, with a positive EBC.
func TestBurstCapacitySettlesAtTwo(t *testing.T) {
	s := settings(t, 10, &config.Overrides{TargetBurstCapacity: ptr.To(7.0)}) // target value 7
	d := New(s, 1, t0, logr.Discard(), "default/hello")
	ready := int32(1)
	var got Decision
	for i := range 60 {
		got = d.Decide(t0.Add(time.Duration(2*i)*time.Second), in(ready, 10, 10))
		ready = got.DesiredScale
	}
	// 10 in flight at 7 per pod => 2 pods; EBC = 2*10 - 7 - 10 = 3 >= 0.
	if got.DesiredScale != 2 || got.ExcessBurstCapacity != 3 {
		t.Errorf("settled at %d pods, EBC %d; want 2 and 3", got.DesiredScale, got.ExcessBurstCapacity)
	}
}

// BenchmarkDecide10000 is one tick for 10,000 targets on one core.
func BenchmarkDecide10000(b *testing.B) {
	s := settings(b, 0, nil)
	ds := make([]*Decider, 10000)
	for i := range ds {
		ds[i] = New(s, 3, t0, logr.Discard(), "default/hello")
	}
	now := t0
	for b.Loop() {
		now = now.Add(2 * time.Second)
		for i, d := range ds {
			d.Decide(now, in(3, float64(i%300), float64(i%400)))
		}
	}
}
