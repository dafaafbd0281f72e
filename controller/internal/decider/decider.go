package decider

import (
	"math"
	"time"

	"github.com/go-logr/logr"

	"github.com/sockscale/sockscale/controller/internal/config"
)

// Inputs are what one decision looks at.
type Inputs struct {
	// ReadyPods is the number of ready pods of the target.
	ReadyPods int32
	// Stable and Panic are the metric's averages over the stable and the
	// panic window. HasData is false when no source reported at all: then
	// no decision is made.
	Stable, Panic float64
	HasData       bool
	// Reachable: traffic can reach the target. Only then is scaling down
	// rate-limited and delayed (and, in the reconciler, min-scale applied).
	Reachable bool
}

// Decision is the outcome of one tick.
type Decision struct {
	// Valid is false when there was no data: nothing should change.
	Valid bool
	// DesiredScale is the wanted pod count; -1 before any data.
	DesiredScale int32
	// ExcessBurstCapacity: how much more load the ready pods could take
	// beyond the target burst capacity; negative means the activator must
	// stay in the path.
	ExcessBurstCapacity int32
	Panicking           bool
	Stable, Panic       float64
	// Activators is how many activators to put in the public endpoints.
	Activators int32
}

// Decider is one target's autoscaling state.
type Decider struct {
	s config.Settings
	// log is shared by every decider, and target names this one's
	// target in its lines: a logger made per target with WithValues
	// kept an encoder buffer each, 37.5 MB at 10,000 targets.
	log    logr.Logger
	target string

	// panicSince is when the target was last over the panic threshold;
	// zero when not panicking.
	panicSince time.Time
	// maxPanicPods is the highest count chosen in this panic: a panicking
	// target never scales below it.
	maxPanicPods int32
	// recent holds the desired counts within the scale-down delay.
	recent []sample
}

type sample struct {
	at    time.Time
	value int32
}

// New returns a decider for a target that has readyPods ready now. A target
// with more than one ready pod starts in panic at that count, so a
// controller restart never scales a busy target down on its first ticks.
// Its panic transitions are logged to log with target as "podautoscaler".
func New(s config.Settings, readyPods int32, now time.Time, log logr.Logger, target string) *Decider {
	d := &Decider{s: s, log: log, target: target}
	if readyPods > 1 {
		d.panicSince = now
		d.maxPanicPods = readyPods
	}
	return d
}

// Update changes the settings (a spec or ConfigMap change) and keeps the
// state.
func (d *Decider) Update(s config.Settings) { d.s = s }

// Settings are the decider's current settings.
func (d *Decider) Settings() config.Settings { return d.s }

// Decide makes the decision for now.
func (d *Decider) Decide(now time.Time, in Inputs) Decision {
	s := d.s
	if !in.HasData {
		return Decision{DesiredScale: -1, ExcessBurstCapacity: initialEBC(s), Activators: Activators(s, in.ReadyPods)}
	}
	ready := float64(max(1, in.ReadyPods))

	// Rate limits. Example: ready=3, up rate 1000, down rate 2:
	// maxUp = ceil(3000) = 3000, maxDown = floor(3/2) = 1.
	maxUp := math.Ceil(s.MaxScaleUpRate * ready)
	maxDown := 0.0
	if in.Reachable {
		maxDown = math.Floor(ready / s.MaxScaleDownRate)
	}

	// Example: stable 140 at target value 70 => 2 pods.
	rawStable := math.Ceil(in.Stable / s.TargetValue)
	rawPanic := math.Ceil(in.Panic / s.TargetValue)
	stablePods := clamp(rawStable, maxDown, maxUp)
	panicPods := clamp(rawPanic, maxDown, maxUp)
	if s.ActivationScale > 1 {
		stablePods = activate(rawStable, stablePods, s.ActivationScale)
		panicPods = activate(rawPanic, panicPods, s.ActivationScale)
	}

	// Panic: over the threshold when the panic window alone would want
	// threshold times the ready pods. Example: 1 ready, panic value 280,
	// target 70 => 4 pods, 4/1 >= 2.0 => panic.
	over := rawPanic/ready >= s.PanicThreshold
	switch {
	case over && d.panicSince.IsZero():
		d.log.Info("PANICKING", "podautoscaler", d.target, "panicPods", rawPanic, "readyPods", ready, "threshold", s.PanicThreshold, "panicValue", in.Panic)
		d.panicSince = now
	case over:
		d.panicSince = now // still over: the panic lasts a stable window from now
	case !d.panicSince.IsZero() && now.After(d.panicSince.Add(s.StableWindow)):
		// Strictly more than a stable window since the last tick over the
		// threshold (Knative's rule): over at 6 s, a 60 s window, still
		// panicking at 66 s, out at the first tick after.
		d.log.Info("Un-panicking", "podautoscaler", d.target, "stablePods", stablePods, "readyPods", ready, "overSince", d.panicSince)
		d.panicSince = time.Time{}
		d.maxPanicPods = 0
	}

	desired := stablePods
	panicking := !d.panicSince.IsZero()
	if panicking {
		desired = max(stablePods, panicPods, float64(d.maxPanicPods))
		d.maxPanicPods = int32(desired)
	}
	want := int32(desired)
	// The delay holds only a target traffic can reach (Knative neither
	// applies nor feeds it otherwise): with nothing to serve there is
	// nothing to be careful about.
	if s.ScaleDownDelay > 0 && in.Reachable {
		want = d.delayed(now, want)
	}
	return Decision{
		Valid:               true,
		DesiredScale:        want,
		ExcessBurstCapacity: excessBurstCapacity(s, in.ReadyPods, in.Panic),
		Panicking:           panicking,
		Stable:              in.Stable,
		Panic:               in.Panic,
		Activators:          Activators(s, in.ReadyPods),
	}
}

// delayed is the highest desired count within the scale-down delay: a
// scale-down only happens once it has been wanted for the whole delay.
func (d *Decider) delayed(now time.Time, want int32) int32 {
	cutoff := now.Add(-d.s.ScaleDownDelay)
	keep := d.recent[:0]
	for _, r := range d.recent {
		if r.at.After(cutoff) {
			keep = append(keep, r)
		}
	}
	d.recent = append(keep, sample{now, want})
	for _, r := range d.recent {
		want = max(want, r.value)
	}
	return want
}

func clamp(v, lo, hi float64) float64 { return math.Min(math.Max(v, lo), hi) }

// activate raises pods (the rate-limited count) to the activation scale
// when the load wants any pod (raw, before rate limits, is > 0). It looks
// at raw, not pods: idle with 5 ready, the scale-down limit alone keeps
// floor(5/2) = 2, which is no activation and must not go back to 5.
func activate(raw, pods float64, scale int32) float64 {
	if raw > 0 {
		return math.Max(pods, float64(scale))
	}
	return pods
}

// excessBurstCapacity is what the ready pods could take beyond the target
// burst capacity and the panic load. Example: 3 ready, 10 per pod, TBC 10,
// panic 15.8 => floor(3*10 - 10 - 15.8) = 4.
func excessBurstCapacity(s config.Settings, ready int32, panicValue float64) int32 {
	switch {
	case s.TargetBurstCapacity == 0:
		return 0
	case s.TargetBurstCapacity < 0:
		return -1 // the activator stays in the path
	}
	return int32(math.Floor(float64(ready)*s.Total - s.TargetBurstCapacity - panicValue))
}

// initialEBC is the excess burst capacity before any data, as Knative
// sets it: what the initial scale's pods could take beyond the burst
// capacity, initialScale x total - TBC, truncated towards zero (Knative
// converts without flooring here). Example: defaults, 1 x 100 - 211 =
// -111, so the activator stays in the path until data shows otherwise;
// initial scale 3 of target 10 with TBC 7: 30 - 7 = 23, Serve at once.
func initialEBC(s config.Settings) int32 {
	switch {
	case s.TargetBurstCapacity == 0:
		return 0
	case s.TargetBurstCapacity < 0:
		return -1
	}
	return int32(float64(s.InitialScale)*s.Total - s.TargetBurstCapacity)
}

// Activators is how many activators to put in a target's path: 2 when TBC
// is 0 and there is no containerConcurrency (the activators are in the
// path only at zero), else enough for the ready pods' capacity plus the
// burst capacity, at least 2 (docs/autoscaling.md, "How many
// activators"). Example: 5 pods of 10, TBC 211, capacity 100 =>
// ceil((50 + 211) / 100) = 3; 30 pods of CC 10, TBC 0 => 3.
//
// Never more than the containerConcurrency, when it has one (a departure
// from Knative, which relies on queue-proxy to queue what its activators
// oversubscribe): the activators in the path split each pod's CC slots
// among them, so with more activators than slots some activator has none
// at a pod, and if it has none at any pod its requests wait for good once
// the target is at max-scale. With at most CC activators each owns at
// least one slot at every pod. Example: CC 1 => 1 activator.
func Activators(s config.Settings, readyPods int32) int32 {
	n := int32(2)
	if s.TargetBurstCapacity != 0 || s.ContainerConcurrency > 0 {
		need := math.Ceil((float64(readyPods)*s.Total + math.Max(s.TargetBurstCapacity, 0)) / s.ActivatorCapacity)
		n = int32(math.Max(2, need))
	}
	if cc := s.ContainerConcurrency; cc > 0 && n > cc {
		n = cc
	}
	return n
}
