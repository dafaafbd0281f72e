package socketlayer

import (
	"context"
	"time"

	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

// DefaultNotifyPeriod is how often a Notifier looks at the summary.
const DefaultNotifyPeriod = 2 * time.Second

// DefaultMinNotifyInterval is the least time between two events. Each
// event rewrites the condition of every ServerlessService, so a node
// whose agent flaps must not turn into a stream of status writes: its
// changes within the interval make one event at its end.
const DefaultMinNotifyInterval = 10 * time.Second

// Notifier is a manager Runnable that sends an event on C whenever the
// Tracker's summary changes in a way the conditions show (see
// Summary.key): the ServerlessService reconciler watches C and rewrites
// every condition. A change between two looks that reverts before the
// second is not seen, which is what a condition should show anyway.
type Notifier struct {
	Tracker *Tracker
	// C gets one event per change; a send never blocks (an event still
	// waiting already asks for everything to be looked at again).
	C chan<- event.GenericEvent
	// Object is the event's object, for the receiving handler's map
	// function (it enqueues every ServerlessService, whatever this is).
	Object client.Object
	// Period defaults to DefaultNotifyPeriod, MinInterval to
	// DefaultMinNotifyInterval, Clock to the real clock.
	Period      time.Duration
	MinInterval time.Duration
	Clock       clock.WithTicker
}

// NeedLeaderElection is false: every replica runs it; a standby's reconciler does
// not read C, and the sends do not block.
func (n *Notifier) NeedLeaderElection() bool { return false }

// Start looks every Period until ctx ends.
func (n *Notifier) Start(ctx context.Context) error {
	period, minInterval, clk := n.Period, n.MinInterval, n.Clock
	if period <= 0 {
		period = DefaultNotifyPeriod
	}
	if minInterval <= 0 {
		minInterval = DefaultMinNotifyInterval
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	tick := clk.NewTicker(period)
	defer tick.Stop()
	last := n.Tracker.Summary().key()
	var sent time.Time // zero: the first change goes out at once
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C():
		}
		// A change seen too soon after the last event waits: last is
		// not updated, so a later look still sees it.
		if k := n.Tracker.Summary().key(); k != last && clk.Since(sent) >= minInterval {
			last, sent = k, clk.Now()
			select {
			case n.C <- event.GenericEvent{Object: n.Object}:
			default:
			}
		}
	}
}
