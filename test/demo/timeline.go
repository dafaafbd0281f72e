package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/test/stack"
)

// rowPeriod is the table's and the plot's sampling period.
const rowPeriod = 2 * time.Second

// timeline prints the live table and keeps its rows for the plot.
type timeline struct {
	s       *stack.Stack
	act     *activators
	w       io.Writer
	begin   time.Time
	samples []Sample
	markers []Marker
}

const tableRow = "%6s %8s %9s %8s %6s %5s %6s %6s\n"

func (tl *timeline) header() {
	fmt.Fprintf(tl.w, tableRow, "time", "offered", "observed", "desired", "ready", "held", "mode", "panic")
}

func (tl *timeline) say(format string, args ...any) {
	fmt.Fprintf(tl.w, "==> %6s "+format+"\n", append([]any{fmt.Sprintf("%ds", int(time.Since(tl.begin).Seconds()))}, args...)...)
}

// row samples the app's PodAutoscaler, Deployment and the activators, and
// prints and keeps the row.
func (tl *timeline) row(ctx context.Context, offered int) Sample {
	sm := Sample{At: time.Since(tl.begin), Offered: float64(offered), Held: tl.act.heldNow(ctx)}
	if pa, err := tl.s.PA(ctx, appNS, appName); err == nil {
		sm.Observed, _ = strconv.ParseFloat(pa.Status.StableValue, 64)
		if pa.Status.DesiredScale != nil {
			sm.Desired = *pa.Status.DesiredScale
		}
		sm.Mode, sm.Panicking = string(pa.Status.Mode), pa.Status.Panicking
	}
	if d, err := tl.s.Deployment(ctx, appNS, appName); err == nil {
		sm.Ready = d.Status.ReadyReplicas
	}
	tl.samples = append(tl.samples, sm)
	held := "-"
	if sm.Held >= 0 {
		held = strconv.FormatFloat(sm.Held, 'f', 0, 64)
	}
	fmt.Fprintf(tl.w, tableRow, fmt.Sprintf("%ds", int(sm.At.Seconds())), strconv.Itoa(offered), strconv.FormatFloat(sm.Observed, 'f', 1, 64),
		strconv.Itoa(int(sm.Desired)), strconv.Itoa(int(sm.Ready)), held, sm.Mode, strconv.FormatBool(sm.Panicking))
	return sm
}

// rows prints a row every rowPeriod for d, or until done (if not nil)
// says so after a row; it says whether done did.
func (tl *timeline) rows(ctx context.Context, offered int, d time.Duration, done func(Sample) bool) (bool, error) {
	for end := time.Now().Add(d); time.Now().Before(end); {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(rowPeriod):
		}
		if sm := tl.row(ctx, offered); done != nil && done(sm) {
			return true, nil
		}
	}
	return false, nil
}

// ramp runs the load steps (a handler sleeping 200 ms per request, each
// step's clients replacing the last step's).
func (tl *timeline) ramp(ctx context.Context, f *flags, url string) (completed, failed int64, err error) {
	var loads []*loadgen.Load
	stopAll := func() {
		for _, l := range loads {
			r := l.Stop()
			completed, failed = completed+r.Completed, failed+r.Failed
		}
		loads = nil
	}
	defer stopAll()
	for _, offered := range f.ramp {
		stopAll()
		if offered > 0 {
			loads = append(loads, loadgen.Start(ctx, loadgen.Options{URLs: []string{url + "?sleep=200"}, Concurrency: offered, KeepAlive: true}))
		}
		if _, err := tl.rows(ctx, offered, f.step, nil); err != nil {
			return completed, failed, err
		}
	}
	stopAll()
	return completed, failed, nil
}

// coldStart lets the app go idle until it is at zero (the 10 s window
// empties, Proxy mode, then the 30 s grace period), sends f.burst requests
// at once and follows the scale from zero they cause.
func (tl *timeline) coldStart(ctx context.Context, wc client.WithWatch, f *flags, url string) (*breakdown, error) {
	tl.say("no load: idle for the 10 s window -> desired 0, Proxy mode (the activators take the public Service) -> the last pod goes after the 30 s grace period")
	tl.markers = append(tl.markers, Marker{At: time.Since(tl.begin), Label: "load ends"})
	atZero := func(sm Sample) bool { return sm.Mode == string(v1alpha1.ModeProxy) && sm.Desired == 0 && sm.Ready == 0 }
	zero, err := tl.rows(ctx, 0, 3*time.Minute, func(sm Sample) bool {
		if !atZero(sm) {
			return false
		}
		d, err := tl.s.Deployment(ctx, appNS, appName)
		return err == nil && d.Status.Replicas == 0 && d.Spec.Replicas != nil && *d.Spec.Replicas == 0
	})
	if err != nil {
		return nil, err
	}
	if !zero {
		return nil, fmt.Errorf("%s/%s not at zero 3 minutes after the load ended", appNS, appName)
	}
	tl.say("at zero: no pod, the public Service's endpoints are the activators")

	// Watch the API objects and the activators from now on, so the
	// stages are seen as they happen.
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var sentAt atomic.Pointer[time.Time]
	since := func() time.Time {
		if t := sentAt.Load(); t != nil {
			return *t
		}
		return time.Time{}
	}
	m := &marks{}
	watching, scraping := make(chan struct{}), make(chan struct{})
	watchErr := make(chan error, 1)
	go func() { watchErr <- watchScaleUp(wctx, wc, appNS, appName, since, m, watching) }()
	type actRes struct {
		tl  *actTimeline
		err error
	}
	actDone := make(chan actRes, 1)
	go func() {
		atl, err := tl.act.Watch(wctx, 10*time.Millisecond, scraping)
		actDone <- actRes{atl, err}
	}()
	for _, ch := range []chan struct{}{watching, scraping} {
		select {
		case <-ch:
		case err := <-watchErr:
			return nil, err
		case r := <-actDone:
			return nil, fmt.Errorf("watch the activators: %w", r.err)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if _, err := tl.rows(ctx, 0, 3*rowPeriod, nil); err != nil {
		return nil, err
	}

	// The requests go out at once; the table goes on while they are held.
	now := time.Now()
	sentAt.Store(&now)
	tl.markers = append(tl.markers, Marker{At: now.Sub(tl.begin), Label: fmt.Sprintf("%d requests at zero", f.burst)})
	answers := make(chan *burstResult, 1)
	go func() { answers <- burst(ctx, url, f.burst) }()
	tl.say("%d requests sent at once, on new connections, to the public Service at zero", f.burst)
	var b *burstResult
	if _, err := tl.rows(ctx, 0, 2*time.Minute, func(Sample) bool {
		select {
		case b = <-answers:
			return true
		default:
			return false
		}
	}); err != nil {
		return nil, err
	}
	if b == nil {
		return nil, fmt.Errorf("%d requests sent at zero: not all answered after 2 minutes", f.burst)
	}
	if n := len(b.latencies); n > 0 {
		tl.markers = append(tl.markers, Marker{At: b.sent.Add(b.latencies[0]).Sub(tl.begin), Label: "first answer"})
		tl.say("%d requests at zero: %d answered 200, the first in %s, the last in %s", f.burst, n, ms(b.latencies[0]), ms(b.latencies[n-1]))
	} else {
		tl.say("%d requests at zero: none answered 200 (%s)", f.burst, b.failed[0])
	}
	if _, err := tl.rows(ctx, 0, f.after, nil); err != nil {
		return nil, err
	}
	stop()
	if err := <-watchErr; err != nil {
		return nil, err
	}
	r := <-actDone
	if r.err != nil {
		return nil, fmt.Errorf("watch the activators: %w", r.err)
	}
	return newBreakdown(b, m, r.tl), nil
}
