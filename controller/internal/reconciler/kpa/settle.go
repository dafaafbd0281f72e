package kpa

import (
	"math"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
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
//
// Condition messages get the same treatment in time: unless messagesDue,
// a status whose only change is the message of a condition that keeps
// its status and reason is not written (the old messages are kept). Such
// messages carry counts ("no stats ... from 3 of the 50 ready pods"),
// and under load they move every tick: at 3,000 targets half of them
// rewrote their status every few seconds as posts were refused, and the
// writes slowed the API server, which slowed decisions, which... The
// caller makes messagesDue true every messageRefresh. A change of a
// condition's status or reason, or anything else, is written at once,
// with the messages of the moment.
func settle(old, held, fresh *v1alpha1.PodAutoscalerStatus, messagesDue bool) *v1alpha1.PodAutoscalerStatus {
	out := fresh
	if equality.Semantic.DeepEqual(old, held) && !moved(old.StableValue, fresh.StableValue) && !moved(old.PanicValue, fresh.PanicValue) {
		out = held
	}
	if !messagesDue {
		if kept := withMessagesOf(out, old); equality.Semantic.DeepEqual(old, kept) {
			return kept
		}
	}
	return out
}

// messageRefresh is how often a condition's message may change alone
// (settle).
const messageRefresh = 30 * time.Second

// withMessagesOf is a copy of s in which every condition that has the
// same type, status and reason in old shows old's message.
func withMessagesOf(s, old *v1alpha1.PodAutoscalerStatus) *v1alpha1.PodAutoscalerStatus {
	out := s.DeepCopy()
	for i := range out.Conditions {
		c := &out.Conditions[i]
		if o := meta.FindStatusCondition(old.Conditions, c.Type); o != nil && o.Status == c.Status && o.Reason == c.Reason {
			c.Message = o.Message
		}
	}
	return out
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
