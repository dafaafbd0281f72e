package kpa

import (
	"math"
	"strconv"

	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/sockscale/sockscale/controller/api/v1alpha1"
)

// valueDrift is how far (relative) the stable or panic value may move
// before the status shows the new one on its own.
const valueDrift = 0.05

// settle chooses the status to write after a tick: held is the tick's
// status showing old's stable and panic values (and the messages made
// from them), fresh the same status showing this tick's values. Every
// target ticks every 2 s and its averages move a little every tick under
// load, so writing them each time would cost the API server a write per
// loaded target per tick: ~5,000 writes a second at 10,000 targets. So
// held is kept (no write: it equals old) unless something else changed
// (scale, mode, activators, panic, EBC, a condition's status, reason or
// another part of its message) or a value moved by more than valueDrift
// relative, or to or from 0. Example: stable 70.000 shown; 72.500 (+3.6 %)
// keeps 70.000, 73.600 (+5.1 %) is written, and so is 0.000 -> 0.400.
func settle(old, held, fresh *v1alpha1.PodAutoscalerStatus) *v1alpha1.PodAutoscalerStatus {
	if equality.Semantic.DeepEqual(old, held) && !moved(old.StableValue, fresh.StableValue) && !moved(old.PanicValue, fresh.PanicValue) {
		return held
	}
	return fresh
}

// moved tells whether a shown value (a decimal string, "" for none) is to
// be replaced by now's.
func moved(shown, now string) bool {
	if shown == now {
		return false
	}
	a, errA := strconv.ParseFloat(shown, 64)
	b, errB := strconv.ParseFloat(now, 64)
	if errA != nil || errB != nil || (a == 0) != (b == 0) || (a < 0) != (b < 0) {
		return true
	}
	return math.Abs(b-a) > valueDrift*math.Abs(a)
}
