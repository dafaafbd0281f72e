package drain

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/sockscale/sockscale/agent/internal/endpointwatch"
	"github.com/sockscale/sockscale/agent/internal/podwatch"
	"github.com/sockscale/sockscale/bpf"
)

// Kernel is what a drain asks of the accounting programs (bpf.Accounting).
type Kernel interface {
	ConnActivity(fd int) (bpf.ConnActivity, error)
	Drain(fd int) error
	// Snapshot gives each pod's requests as the kernel counts them,
	// those on connections no process has accepted yet too.
	Snapshot() (bpf.Snapshot, error)
}

// Pods lists the node's leaving pods (podwatch.Watcher).
type Pods interface {
	Leaving() []podwatch.Leaving
	// Has says whether the pod is still there (not finished, not
	// deleted).
	Has(uid types.UID) bool
}

// Deleting lists the node's pods of a workload whose deletion the API
// server has, read afresh (podwatch.DeletingPods): a preStop hook's wait
// is for those, and the watch that Pods follows may not show them yet.
type Deleting func(ctx context.Context, namespace, workload string) ([]types.UID, error)

// Endpoints says whether some Service of a namespace still sends new
// connections to an address (endpointwatch.Watcher).
type Endpoints interface {
	Of(namespace string, addr netip.Addr) endpointwatch.State
}

// ConnSource finds a pod's connections (Sockets).
type ConnSource interface {
	ServerConns(pod netip.Addr) ([]int, error)
}

// Options tune a Drainer; zero values take the defaults.
type Options struct {
	// Poll is how often the leaving pods' connections are looked at
	// (default 100 ms).
	Poll time.Duration
	// IdleClose is how long an idle connection that was handed over is
	// left open for its client's next request before our side closes it
	// (default 1 s).
	IdleClose time.Duration
	// MinWait is how long a pod is held at least after its deletion,
	// and after the last EndpointSlice that listed it as ready stopped
	// doing so (default 2 s): the time kube-proxy and the activators take
	// to stop sending it new connections, which a pod without any would
	// otherwise refuse once its app stopped.
	MinWait time.Duration
	// Quiet is how long no new request may have started on a pod before
	// it counts as drained (default 1 s): new connections still coming
	// mean some kube-proxy or activator has not yet stopped sending it
	// any, however long MinWait was; a request that came just after the
	// drain ended would meet an app that stopped.
	Quiet time.Duration
	// Endpoints, if set, holds a pod while some EndpointSlice lists it
	// as ready (and MinWait after); nil, or before its first list, the
	// deletion alone starts MinWait.
	Endpoints Endpoints
	// Deleting, if set, tells each wait which pods it is for; nil, a
	// wait is for the leaving pods the watch shows.
	Deleting   Deleting
	Clock      clock.WithTicker
	Registerer prometheus.Registerer
	Log        *slog.Logger
}

// stillDrainingEvery is how often the log says what holds a leaving pod
// that is not drained yet.
const stillDrainingEvery = 10 * time.Second

// Drainer drains every leaving pod of the node, from the moment its
// deletion is seen: each HTTP/1.x connection is handed to the kernel's
// drain program between two responses, so its next response asks the
// client to close it, and an idle one is closed after IdleClose. A pod is
// drained when none of its connections has a request in flight or is
// idle, the kernel counts no request in flight on it and none started for
// Quiet, no EndpointSlice lists it as ready, and MinWait has passed since
// its deletion and since the last slice dropped it; Wait tells a preStop
// hook so.
type Drainer struct {
	kernel  Kernel
	pods    Pods
	conns   ConnSource
	opts    Options
	clock   clock.WithTicker
	log     *slog.Logger
	metrics *metrics

	mu     sync.Mutex
	states map[types.UID]*podState
	// tick is closed and replaced at the end of every round: waiters
	// look again then.
	tick chan struct{}
}

type podState struct {
	leaving podwatch.Leaving
	drain   *podDrain
	last    Round
	// What the kernel counted at the last round: requests in flight, the
	// count of those started, and since when that count has not moved
	// (quietFrom; zero until a round read it).
	kernelInFlight int64
	started        uint64
	quietFrom      time.Time
	// What the EndpointSlices said at the last round: the slices that
	// still list the pod as ready, or since when none does (zero: none
	// ever did, or they are not known).
	readyIn    []string
	unroutedAt time.Time
	// done: drained and held for MinWait; then no longer looked at.
	done bool
	// toldAt is when the log last said what holds the pod; readErr the
	// last error reading its connections that the log said.
	toldAt  time.Time
	readErr string
}

// inFlight is the pod's requests in flight at the last round: as its
// connections showed them, or as the kernel counted them when that is
// more (a request on a connection not accepted yet).
func (st *podState) inFlight() int { return max(st.last.InFlight, int(st.kernelInFlight)) }

// heldFrom is when MinWait starts: at the pod's deletion, or later when
// an EndpointSlice listed it as ready after that.
func (st *podState) heldFrom() time.Time {
	if st.unroutedAt.After(st.leaving.Since) {
		return st.unroutedAt
	}
	return st.leaving.Since
}

// New returns a Drainer; Run drives it.
func New(kernel Kernel, pods Pods, conns ConnSource, o Options) *Drainer {
	if o.Poll <= 0 {
		o.Poll = 100 * time.Millisecond
	}
	if o.IdleClose <= 0 {
		o.IdleClose = time.Second
	}
	if o.MinWait <= 0 {
		o.MinWait = 2 * time.Second
	}
	if o.Quiet <= 0 {
		o.Quiet = time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return &Drainer{kernel: kernel, pods: pods, conns: conns, opts: o, clock: o.Clock, log: o.Log,
		metrics: newMetrics(o.Registerer), states: map[types.UID]*podState{}, tick: make(chan struct{})}
}

// Run looks at the leaving pods every Poll until ctx ends.
func (d *Drainer) Run(ctx context.Context) {
	t := d.clock.NewTicker(d.opts.Poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			d.Round()
		}
	}
}

// Round looks once at every leaving pod that is not drained yet.
func (d *Drainer) Round() {
	now := d.clock.Now()
	leaving := d.pods.Leaving()
	d.mu.Lock()
	defer d.mu.Unlock()
	snap := d.snapshot(leaving)
	present := make(map[types.UID]bool, len(leaving))
	for _, l := range leaving {
		present[l.UID] = true
		st := d.states[l.UID]
		if st == nil {
			st = &podState{leaving: l, drain: newPodDrain()}
			d.states[l.UID] = st
			d.metrics.started.Inc()
			d.log.Info("draining", "pod", l.Namespace+"/"+l.Name, "ips", l.IPs)
		}
		if st.done {
			continue
		}
		st.last = d.look(now, st)
		d.observeKernel(now, st, snap)
		d.observeEndpoints(st)
		if st.last.Drained() && st.kernelInFlight == 0 && now.Sub(st.quietFrom) >= d.opts.Quiet &&
			len(st.readyIn) == 0 && now.Sub(st.heldFrom()) >= d.opts.MinWait {
			st.done = true
			d.metrics.drains.WithLabelValues(resultDrained).Inc()
			d.metrics.took.Observe(now.Sub(l.Since).Seconds())
			d.log.Info("drained", "pod", l.Namespace+"/"+l.Name, "after", now.Sub(l.Since).Round(time.Millisecond),
				"opaque", st.last.Opaque, "unknown", st.last.Unknown)
		} else if now.Sub(l.Since) >= stillDrainingEvery && now.Sub(st.toldAt) >= stillDrainingEvery {
			// What holds a pod that is slow to drain, for whoever wonders
			// why its termination takes so long.
			st.toldAt = now
			d.log.Info("still draining", "pod", l.Namespace+"/"+l.Name, "for", now.Sub(l.Since).Round(time.Second),
				"requests_in_flight", st.last.InFlight, "idle_connections", st.last.Idle, "kernel_requests_in_flight", st.kernelInFlight,
				"last_request_started", now.Sub(st.quietFrom).Round(time.Millisecond), "ready_in", st.readyIn,
				"opaque", st.last.Opaque, "unknown", st.last.Unknown)
		}
	}
	for uid, st := range d.states {
		if present[uid] {
			continue
		}
		// Deleted (or its address taken) before it was drained: its app
		// stopped with these requests in flight.
		if !st.done {
			d.metrics.drains.WithLabelValues(resultGone).Inc()
			cut := st.inFlight()
			d.metrics.cut.Add(float64(cut))
			d.log.Warn("pod went before it was drained", "pod", st.leaving.Namespace+"/"+st.leaving.Name,
				"requests_in_flight", cut)
		}
		delete(d.states, uid)
	}
	draining := 0
	for _, st := range d.states {
		if !st.done {
			draining++
		}
	}
	d.metrics.draining.Set(float64(draining))
	close(d.tick)
	d.tick = make(chan struct{})
}

// snapshot reads the kernel's counters when a leaving pod is not drained
// yet; nil when none is, or the read failed (logged, counted): the rounds
// then go by the pods' connections alone.
func (d *Drainer) snapshot(leaving []podwatch.Leaving) map[netip.Addr]bpf.PodCounters {
	undone := false
	for _, l := range leaving {
		if st := d.states[l.UID]; st == nil || !st.done {
			undone = true
			break
		}
	}
	if !undone {
		return nil
	}
	snap, err := d.kernel.Snapshot()
	if err != nil {
		d.metrics.errors.Inc()
		d.log.Warn("drain: cannot read the kernel's counters; going by the connections alone", "error", err)
		return nil
	}
	return snap.Pods
}

// observeKernel keeps what the kernel counts of st's pod: its requests in
// flight, and since when none started. A pod the kernel does not count
// (its slot gone, or no counters this round) is quiet from its first
// round on, with nothing in flight.
func (d *Drainer) observeKernel(now time.Time, st *podState, snap map[netip.Addr]bpf.PodCounters) {
	// A dual-stack pod's addresses are counted apart (a slot each): its
	// requests are those of both.
	var pc bpf.PodCounters
	ok := false
	for _, ip := range st.leaving.IPs {
		if c, in := snap[ip]; in {
			pc, ok = pc.Add(c), true
		}
	}
	if !ok {
		st.kernelInFlight = 0
		if st.quietFrom.IsZero() {
			st.quietFrom = now
		}
		return
	}
	st.kernelInFlight = pc.Requests.InFlight
	if st.quietFrom.IsZero() || pc.Requests.Started != st.started {
		st.started, st.quietFrom = pc.Requests.Started, now
	}
}

// observeEndpoints keeps what the EndpointSlices say of st's pod: which
// still list it as ready (kube-proxy and its peers send it new
// connections by those), or since when none does.
func (d *Drainer) observeEndpoints(st *podState) {
	st.readyIn, st.unroutedAt = nil, time.Time{}
	if d.opts.Endpoints == nil {
		return
	}
	// Ready in a slice of either of its addresses' families: held.
	for _, ip := range st.leaving.IPs {
		if e := d.opts.Endpoints.Of(st.leaving.Namespace, ip); e.Known {
			st.readyIn = append(st.readyIn, e.Slices...)
			if e.Since.After(st.unroutedAt) {
				st.unroutedAt = e.Since
			}
		}
	}
}

// look runs one round over a pod's connections. Called with d.mu held:
// the socket reads are quick, and rounds are serial anyway.
func (d *Drainer) look(now time.Time, st *podState) Round {
	var fds []int
	var errs []error
	for _, ip := range st.leaving.IPs {
		f, err := d.conns.ServerConns(ip)
		fds = append(fds, f...)
		errs = append(errs, err)
	}
	err := errors.Join(errs...)
	unreadable := err != nil
	if unreadable {
		// Drained goes by the connections found and the kernel's
		// counts then; said once per pod and error, not every round.
		d.metrics.errors.Inc()
		if msg := err.Error(); msg != st.readErr {
			st.readErr = msg
			d.log.Warn("drain: cannot read all of the pod's connections: its clients are not asked to move, and only the kernel's counts tell when it is drained",
				"pod", st.leaving.Namespace+"/"+st.leaving.Name, "error", err)
		}
	}
	defer func() {
		for _, fd := range fds {
			closeFD(fd)
		}
	}()
	conns := make([]Conn, 0, len(fds))
	for _, fd := range fds {
		c := Conn{Activity: bpf.ConnUnknown}
		if c.Cookie, err = cookieOf(fd); err == nil {
			c.Activity, err = d.kernel.ConnActivity(fd)
		}
		if err == nil {
			c.Unsent, err = unsentBytes(fd)
		}
		if err != nil {
			c.Activity = bpf.ConnUnknown
		}
		conns = append(conns, c)
	}
	acts, r := st.drain.round(now, conns, d.opts.IdleClose)
	if unreadable {
		r.Unknown++
	}
	for i, a := range acts {
		switch a {
		case HandOver:
			if err := d.kernel.Drain(fds[i]); err != nil {
				d.metrics.errors.Inc()
				d.log.Warn("drain: hand a connection over", "pod", st.leaving.Namespace+"/"+st.leaving.Name, "error", err)
				continue
			}
			d.metrics.handed.Inc()
		case CloseIdle:
			if err := closeWrite(fds[i]); err != nil {
				d.metrics.errors.Inc()
				continue
			}
			d.metrics.idleClosed.Inc()
		}
	}
	return r
}

// Result is what Wait found.
type Result struct {
	// Pods are the leaving pods that matched; Drained how many of them are.
	Pods, Drained int
	// InFlight counts the requests the undrained ones still had.
	InFlight int
}

// Wait blocks until every pod of namespace's workload that is leaving
// the node is drained, or ctx ends (the caller's deadline). The kubelet
// calls a preStop hook right after the pod's deletion, which the agent's
// watch may show only later: with Options.Deleting, the wait is for the
// pods the API server has deleting when it begins (its caller's among
// them), each until it is drained or gone; none deleting (a container
// restarted for its liveness probe) ends it at once. Without, or when
// that read fails, it is for the leaving pods the watch shows, and if
// none shows within noneGrace it ends.
func (d *Drainer) Wait(ctx context.Context, namespace, workload string, noneGrace time.Duration) Result {
	start := d.clock.Now()
	var uids []types.UID
	fresh := false
	if d.opts.Deleting != nil {
		var err error
		if uids, err = d.opts.Deleting(ctx, namespace, workload); err == nil {
			fresh = true
		} else {
			d.metrics.errors.Inc()
			d.log.Warn("drain: cannot list the pods being deleted; the wait goes by the watch", "workload", namespace+"/"+workload, "error", err)
		}
	}
	for {
		d.mu.Lock()
		tick := d.tick
		d.mu.Unlock()
		var r Result
		if fresh {
			r = d.waitResultOf(uids)
			if r.Drained == r.Pods {
				return r
			}
		} else {
			r = d.waitResult(namespace, workload)
			if r.Pods > 0 && r.Drained == r.Pods {
				return r
			}
			if r.Pods == 0 && d.clock.Since(start) >= noneGrace {
				return r
			}
		}
		select {
		case <-ctx.Done():
			return r
		case <-tick:
		}
	}
}

// waitResult is what Wait finds now of namespace and workload's leaving
// pods.
func (d *Drainer) waitResult(namespace, workload string) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	var r Result
	for _, st := range d.states {
		if st.leaving.Namespace != namespace || st.leaving.Workload != workload {
			continue
		}
		r.Pods++
		if st.done {
			r.Drained++
		} else {
			r.InFlight += st.inFlight()
		}
	}
	return r
}

// waitResultOf is what Wait finds now of the pods uids: each drained, or
// gone (nothing left to wait for), or still to drain, which includes one
// the watch does not show leaving yet.
func (d *Drainer) waitResultOf(uids []types.UID) Result {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := Result{Pods: len(uids)}
	for _, uid := range uids {
		switch st := d.states[uid]; {
		case st != nil && st.done:
			r.Drained++
		case st != nil:
			r.InFlight += st.inFlight()
		case !d.pods.Has(uid):
			r.Drained++ // finished or deleted: it no longer holds its address
		}
	}
	return r
}
