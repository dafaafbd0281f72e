package readiness

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/sockscale/sockscale/activator/internal/target"
)

// UserAgent of the probes. The agents do not count requests whose
// User-Agent starts with "sockscale-probe/" as load, so probing a pod
// does not make it look busy.
const UserAgent = "sockscale-probe/readiness"

// Defaults. The kubelet notices readiness after its probe period (10 s by
// default) and Knative's activator probes every 200 ms (~100 ms late on
// average); 15 ms puts a pod to work ~8 ms on average after it starts
// answering (make bench's cold start: p95 15 ms at 15 ms, 23-25 ms at
// 25 ms), for one short connection attempt per starting pod every 15 ms
// (refused at once until it listens).
const (
	DefaultPeriod  = 15 * time.Millisecond
	DefaultTimeout = 300 * time.Millisecond
)

// The fast period is only worth its cost while somebody waits. A pod that
// never becomes ready (crash loop, never listens) was probed every 15 ms
// for as long as it existed: 4,000 connection attempts a minute per pod
// and activator, for nobody. Now a pod is probed every Period only
//
//   - for DefaultFastFor after it appeared (or became unreachable): most
//     pods appear because the autoscaler wants them, and start within a
//     second or two;
//   - while its target holds requests, and DefaultLinger after: the held
//     requests go to the first pod that answers.
//
// Otherwise the period doubles at each probe up to DefaultMaxPeriod: from
// 15 ms, the 9th doubling reaches the 5 s cap ~7.7 s after the fast
// phase, then 12 probes a minute: a never-ready pod nobody waits for gets
// ~87 probes in its first minute (67 in the fast second) and 12 in each
// after, instead of 4,000 a minute for ever. Slow probes cost little latency: the kubelet's readiness probe
// marks the pod ready in its EndpointSlice anyway (every 10 s by default),
// which the watcher passes on; the probe only gets there first. A request
// held for the target (Wake) brings its pods back to Period at once.
const (
	DefaultFastFor   = time.Second
	DefaultLinger    = 3 * time.Second
	DefaultMaxPeriod = 5 * time.Second
)

// Pod is one address of a target's private Service's EndpointSlices.
// Terminating endpoints are left out by the caller.
type Pod struct {
	Addr netip.AddrPort
	// Ready is the EndpointSlice's ready condition.
	Ready bool
	// H2C: the address speaks HTTP/2 without TLS (the target's Service
	// port has appProtocol kubernetes.io/h2c, target.Target.H2C), so it
	// is probed over h2c with prior knowledge. Such a server often
	// speaks nothing else (grpc-go closes a connection that does not
	// open with HTTP/2's preface), and an HTTP/1.1 probe would never see
	// it ready: its requests would wait for the EndpointSlice.
	H2C bool
	// Check is how the pod says it is ready, from its readiness probe
	// (package watch reads it from the pod); nil: a GET of / at Addr
	// (over h2c with H2C), for an endpoint whose pod is not known.
	Check *Check
}

// Check is a pod's own readiness check as the activator makes it: a GET
// of Path at Port with Header (an httpGet readiness probe over plain
// HTTP), or a TCP connection to Port (any other probe, or none). The
// work path is never probed: a probe of / would be one more request
// at a pod the activators hold to its containerConcurrency (measured:
// another activator's probe arriving with a forwarded request gave a
// containerConcurrency 1 pod two requests at once), and / may be costly
// or change state.
type Check struct {
	// HTTP: GET Path; else a TCP connection.
	HTTP bool
	Port uint16
	Path string
	// Header are the probe's httpHeaders ("Host" sets the request's
	// host).
	Header http.Header
}

// Sink takes a target's ready pods (sorted by address) whenever they change.
// The throttle is one.
type Sink interface {
	SetPods(key target.Key, ready []netip.AddrPort)
}

// Options configure a Prober.
type Options struct {
	Sink Sink
	// Period between probes of a pod not ready yet while it matters
	// (default DefaultPeriod): for FastFor after the pod appeared, and
	// while its target holds requests (Wake, Waiting) and Linger after.
	Period time.Duration
	// FastFor, Linger and MaxPeriod: see DefaultFastFor. MaxPeriod below
	// Period is Period.
	FastFor, Linger, MaxPeriod time.Duration
	// Waiting, if set, says whether the target holds requests now (the
	// throttle's Held > 0). It is asked before each probe, so requests
	// held while the target has ready pods (all busy) bring its starting
	// pods back to Period within one slow period; Wake does it at once.
	Waiting func(target.Key) bool
	// Timeout of one probe (default DefaultTimeout).
	Timeout time.Duration
	// Path probed (default "/"). Any answer below 500 means the pod
	// serves: a 404 is the application answering, a 503 one that is not
	// ready yet.
	Path string
	// Clock ticks the probe period (default: the real clock). The per-probe
	// timeout is the HTTP client's, in real time.
	Clock clock.WithTicker
	// Client sends the probes (default: no keep-alive, no redirects
	// followed, no proxy), H2CClient those to H2C pods (default: the
	// same over h2c with prior knowledge only).
	Client, H2CClient *http.Client
	Registerer        prometheus.Registerer
	Log               *slog.Logger
}

// Prober keeps each target's ready set: a pod is ready when its
// EndpointSlice says so, or, if the EndpointSlice has never called it
// ready, once it answers a probe. A pod the EndpointSlice called ready and
// then not ready is not ready: the kubelet saw it fail (or it is going
// away) and a probe of / would not know better. A pod the activator could
// not reach (Unreachable) is not ready until it answers a probe again.
// Probes run only for pods waiting for their first readiness or to be
// reachable again, one goroutine each, stopped when the pod is ready or
// leaves; fast only while it matters (see DefaultFastFor).
type Prober struct {
	sink      Sink
	period    time.Duration
	fastFor   time.Duration
	linger    time.Duration
	maxPeriod time.Duration
	waiting   func(target.Key) bool
	timeout   time.Duration
	path      string
	clock     clock.WithTicker
	client    *http.Client
	h2cClient *http.Client
	m         *metrics
	log       *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	loops  atomic.Int64 // probe loops running; tests read it

	// mu also orders calls to the sink, so it sees sets in the order they
	// were computed.
	mu      sync.Mutex
	closed  bool
	targets map[target.Key]*targetPods
}

type targetPods struct {
	pods     map[netip.AddrPort]*podState
	pushed   []netip.AddrPort // the ready set the sink has
	waitedAt time.Time        // last seen holding requests (Wake, Waiting)
}

type podState struct {
	sliceReady     bool // the EndpointSlice says ready now
	everSliceReady bool // ... or said it once
	probedReady    bool // answered a probe
	unreachable    bool // a forward could not connect; cleared by a probe's answer
	since          time.Time
	fastSince      time.Time          // appeared or became unreachable: probed fast for FastFor
	stop           context.CancelFunc // non-nil while probing
	wake           chan struct{}      // Wake's nudge to the probe loop, buffered 1
	// h2c: probe over h2c (Pod.H2C). The probe loop reads it before
	// each probe, so a Service port that changes its appProtocol takes
	// effect at the next one.
	h2c *atomic.Bool
	// check: the pod's own readiness check (Pod.Check), read the same
	// way.
	check *atomic.Pointer[Check]
}

func (s *podState) ready() bool {
	return !s.unreachable && (s.sliceReady || (s.probedReady && !s.everSliceReady))
}

// probing says whether the pod needs probes: it waits for its first
// readiness, or to be reachable again.
func (s *podState) probing() bool {
	return s.unreachable || (!s.everSliceReady && !s.probedReady)
}

// New returns a Prober; Close stops its probes.
func New(o Options) *Prober {
	p := &Prober{sink: o.Sink, period: o.Period, timeout: o.Timeout, path: o.Path, clock: o.Clock, client: o.Client, h2cClient: o.H2CClient,
		fastFor: o.FastFor, linger: o.Linger, maxPeriod: o.MaxPeriod, waiting: o.Waiting,
		m: newMetrics(o.Registerer), log: o.Log, targets: make(map[target.Key]*targetPods)}
	if p.period <= 0 {
		p.period = DefaultPeriod
	}
	if p.fastFor <= 0 {
		p.fastFor = DefaultFastFor
	}
	if p.linger <= 0 {
		p.linger = DefaultLinger
	}
	if p.maxPeriod <= 0 {
		p.maxPeriod = DefaultMaxPeriod
	}
	p.maxPeriod = max(p.maxPeriod, p.period)
	if p.timeout <= 0 {
		p.timeout = DefaultTimeout
	}
	if p.path == "" {
		p.path = "/"
	}
	if p.clock == nil {
		p.clock = clock.RealClock{}
	}
	if p.client == nil {
		p.client = probeClient(false)
	}
	if p.h2cClient == nil {
		p.h2cClient = probeClient(true)
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p
}

// SetPods replaces the target's pods with those of its EndpointSlices.
func (p *Prober) SetPods(key target.Key, pods []Pod) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	tp := p.targets[key]
	if tp == nil {
		tp = &targetPods{pods: make(map[netip.AddrPort]*podState)}
		p.targets[key] = tp
	}
	seen := make(map[netip.AddrPort]bool, len(pods))
	for _, pod := range pods {
		seen[pod.Addr] = true
		st := tp.pods[pod.Addr]
		if st == nil {
			now := p.clock.Now()
			st = &podState{since: now, fastSince: now, h2c: new(atomic.Bool), check: new(atomic.Pointer[Check])}
			tp.pods[pod.Addr] = st
		}
		st.h2c.Store(pod.H2C)
		st.check.Store(pod.Check)
		st.sliceReady = pod.Ready
		st.everSliceReady = st.everSliceReady || pod.Ready
		p.startOrStop(key, pod.Addr, st)
	}
	for addr, st := range tp.pods {
		if !seen[addr] {
			if st.stop != nil {
				st.stop()
			}
			delete(tp.pods, addr)
		}
	}
	p.push(key, tp)
}

// startOrStop runs a probe loop for the pod while it needs one. p.mu must
// be held.
func (p *Prober) startOrStop(key target.Key, addr netip.AddrPort, st *podState) {
	switch probing := st.probing(); {
	case probing && st.stop == nil:
		ctx, cancel := context.WithCancel(p.ctx)
		st.stop = cancel
		st.wake = make(chan struct{}, 1)
		wake, h2c, check := st.wake, st.h2c, st.check
		p.loops.Add(1)
		p.wg.Go(func() {
			defer p.loops.Add(-1)
			p.probeLoop(ctx, key, addr, wake, h2c, check)
		})
	case !probing && st.stop != nil:
		st.stop()
		st.stop = nil
	}
}

// Unreachable takes a pod the activator could not connect to out of the
// ready set until it answers a probe: its EndpointSlice may call it ready
// for seconds after it died (the kubelet probes every 10 s by default), and
// every request sent there meanwhile would fail. A pod the prober does not
// know is ignored.
func (p *Prober) Unreachable(key target.Key, addr netip.AddrPort) {
	p.mu.Lock()
	defer p.mu.Unlock()
	tp := p.targets[key]
	if p.closed || tp == nil || tp.pods[addr] == nil {
		return
	}
	st := tp.pods[addr]
	if st.unreachable {
		return
	}
	st.unreachable = true
	st.fastSince = p.clock.Now() // it served until now: requests are likely
	p.log.Info("pod unreachable, probing it until it answers", "target", key, "pod", addr)
	p.startOrStop(key, addr, st)
	p.push(key, tp)
}

// Wake says the target holds requests now: its pods not ready yet are
// probed at once, then every Period while it holds some and Linger after.
// The wiring calls it from the throttle's OnCold, the first request held
// for a target without a ready pod; it must not block, and does not.
func (p *Prober) Wake(key target.Key) {
	p.mu.Lock()
	defer p.mu.Unlock()
	tp := p.targets[key]
	if p.closed || tp == nil {
		return
	}
	tp.waitedAt = p.clock.Now()
	for _, st := range tp.pods {
		if st.stop != nil {
			select {
			case st.wake <- struct{}{}:
			default: // already nudged
			}
		}
	}
}

// Delete forgets the target and stops its probes. The sink is not told:
// the wiring deletes the target there too.
func (p *Prober) Delete(key target.Key) {
	p.mu.Lock()
	defer p.mu.Unlock()
	tp := p.targets[key]
	if tp == nil {
		return
	}
	for _, st := range tp.pods {
		if st.stop != nil {
			st.stop()
		}
	}
	delete(p.targets, key)
	p.m.forget(key)
}

// Close stops every probe and waits for them to end.
func (p *Prober) Close() {
	p.mu.Lock()
	p.closed = true
	p.cancel()
	p.mu.Unlock()
	p.wg.Wait()
}

// push gives the sink the target's ready set if it changed. p.mu must be held.
func (p *Prober) push(key target.Key, tp *targetPods) {
	ready := make([]netip.AddrPort, 0, len(tp.pods))
	for addr, st := range tp.pods {
		if st.ready() {
			ready = append(ready, addr)
		}
	}
	slices.SortFunc(ready, netip.AddrPort.Compare)
	if tp.pushed != nil && slices.Equal(ready, tp.pushed) {
		return
	}
	tp.pushed = ready
	p.sink.SetPods(key, ready)
}

// probeLoop probes a pod now and then every period (see nextPeriod) until
// it answers or ctx ends (the pod became ready by its EndpointSlice, or
// left). A nudge on wake probes at once; check (the pod's own) and h2c
// say how to probe.
func (p *Prober) probeLoop(ctx context.Context, key target.Key, addr netip.AddrPort, wake <-chan struct{}, h2c *atomic.Bool, check *atomic.Pointer[Check]) {
	url := "http://" + addr.String() + p.path
	var period time.Duration
	for {
		// The timer exists before the probe, so the period counts from
		// the probe's start, as a ticker's did.
		period = p.nextPeriod(key, addr, period)
		timer := p.clock.NewTimer(period)
		var ok bool
		if ch := check.Load(); ch != nil {
			ok = p.check(ctx, addr.Addr(), ch)
		} else {
			c := p.client
			if h2c.Load() {
				c = p.h2cClient
			}
			ok = p.probe(ctx, c, url)
		}
		if ok {
			timer.Stop()
			p.probed(ctx, key, addr)
			return
		}
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C():
		case <-wake:
			timer.Stop()
		}
	}
}

// nextPeriod is the wait after the probe about to be sent, given the last
// one (0 before the first): Period while the pod is new or its target
// holds requests (or did within Linger), else twice the last, up to
// MaxPeriod.
func (p *Prober) nextPeriod(key target.Key, addr netip.AddrPort, last time.Duration) time.Duration {
	// Asked outside p.mu: the throttle's lock is its own.
	waiting := p.waiting != nil && p.waiting(key)
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	tp := p.targets[key]
	if tp == nil || tp.pods[addr] == nil {
		return p.period // stopped meanwhile; the loop ends on ctx
	}
	if waiting {
		tp.waitedAt = now
	}
	st := tp.pods[addr]
	fast := now.Sub(st.fastSince) < p.fastFor || (!tp.waitedAt.IsZero() && now.Sub(tp.waitedAt) < p.linger)
	if fast || last <= 0 {
		return p.period
	}
	return min(2*last, p.maxPeriod)
}

// probe sends one probe with c and says whether the pod answered as
// serving.
func (p *Prober) probe(loop context.Context, c *http.Client, url string) bool {
	ctx, cancel := context.WithTimeout(loop, p.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		p.m.probes.WithLabelValues(resultError).Inc()
		return false
	}
	req.Header.Set("User-Agent", UserAgent)
	resp, err := c.Do(req)
	if err != nil {
		if loop.Err() == nil { // not stopped by us: refused, reset or timed out
			p.m.probes.WithLabelValues(resultError).Inc()
		}
		return false
	}
	// Read a little so a small body does not reset the connection; the
	// probe's answer is the status.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	if resp.StatusCode >= 500 {
		p.m.probes.WithLabelValues(resultNotReady).Inc()
		return false
	}
	p.m.probes.WithLabelValues(resultReady).Inc()
	return true
}

// check makes the pod's own readiness check at ip once and says whether
// it passed: a TCP connection that opens, or a GET answered 200 to 399
// (what the kubelet takes as ready).
func (p *Prober) check(loop context.Context, ip netip.Addr, ch *Check) bool {
	ctx, cancel := context.WithTimeout(loop, p.timeout)
	defer cancel()
	addr := netip.AddrPortFrom(ip, ch.Port).String()
	if !ch.HTTP {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			if loop.Err() == nil {
				p.m.probes.WithLabelValues(resultError).Inc()
			}
			return false
		}
		conn.Close()
		p.m.probes.WithLabelValues(resultReady).Inc()
		return true
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+ch.Path, nil)
	if err != nil {
		p.m.probes.WithLabelValues(resultError).Inc()
		return false
	}
	for k, vs := range ch.Header {
		req.Header[k] = vs
	}
	if h := ch.Header.Get("Host"); h != "" {
		req.Host = h
	}
	// Ours, whatever the probe's headers say: the agents tell a probe
	// from load by it (the check may be on the serving port).
	req.Header.Set("User-Agent", UserAgent)
	resp, err := p.client.Do(req)
	if err != nil {
		if loop.Err() == nil {
			p.m.probes.WithLabelValues(resultError).Inc()
		}
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		p.m.probes.WithLabelValues(resultNotReady).Inc()
		return false
	}
	p.m.probes.WithLabelValues(resultReady).Inc()
	return true
}

// probeClient is the default probe client: one connection per probe (a
// pod that is not ready yet is probed rarely, and idle connections to
// pods would pile up), no redirects followed, no proxy. With h2c it
// speaks HTTP/2 with prior knowledge and nothing else, as the
// activator's forwards to such pods do (handler.NewH2CTransport): the
// connection is used for the one stream, then closed. A gRPC server
// answers the probe's GET with 415 (not application/grpc), below 500:
// serving.
func probeClient(h2c bool) *http.Client {
	t := &http.Transport{DisableKeepAlives: true, Proxy: nil}
	if h2c {
		t.Protocols = new(http.Protocols)
		t.Protocols.SetUnencryptedHTTP2(true)
	}
	return &http.Client{
		Transport:     t,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// probed marks a pod ready (or reachable again) after it answered, unless its probe was stopped
// meanwhile (the pod left, or the EndpointSlice spoke first).
func (p *Prober) probed(ctx context.Context, key target.Key, addr netip.AddrPort) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ctx.Err() != nil {
		return // stopped under p.mu: the state it would change is gone
	}
	tp := p.targets[key]
	st := tp.pods[addr]
	st.stop() // releases the context
	st.stop = nil
	if st.unreachable {
		st.unreachable = false
		p.log.Info("unreachable pod answers again", "target", key, "pod", addr)
	} else {
		st.probedReady = true
		p.m.probedReady.WithLabelValues(key.Namespace, key.Name).Inc()
		p.log.Info("pod answered its probe before its EndpointSlice called it ready", "target", key, "pod", addr, "after", p.clock.Since(st.since))
	}
	p.push(key, tp)
}
