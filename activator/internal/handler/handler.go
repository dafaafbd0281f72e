package handler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockscale/sockscale/activator/internal/holdpool"
	"github.com/sockscale/sockscale/activator/internal/netpol"
	"github.com/sockscale/sockscale/activator/internal/resolve"
	"github.com/sockscale/sockscale/activator/internal/target"
	"github.com/sockscale/sockscale/activator/internal/throttle"
	"github.com/sockscale/sockscale/internal/activatorprobe"
)

// ProxiedHeader marks a request forwarded by an activator; its value is
// the activator's pod name. (The agents tell proxied requests by the
// connection's peer, not by this header, which a client could forge.) An
// activator refuses a request that already carries it (refuseLoop).
const ProxiedHeader = "Sockscale-Proxied"

// ErrShuttingDown is the cancellation cause of the server's base context
// (NewServer) when the activator stops: held requests then get a 503 that
// says so, and the client retries through another activator.
var ErrShuttingDown = errors.New("activator shutting down")

// Resolver finds a request's target (resolve.Table, or a
// resolve.Picker that fixes how Route hosts choose their revision).
type Resolver interface {
	Resolve(header, host string) (*target.Target, error)
	// Reaches says whether host can lead to target k (a Route's host can
	// lead to several).
	Reaches(host string, k target.Key) bool
}

// Throttler holds a request until a pod of its target has a free slot
// (throttle.Throttler).
type Throttler interface {
	Try(ctx context.Context, key target.Key, fn func(throttle.Slot) error) error
	// ReadyPods is how many ready pods the target has now.
	ReadyPods(key target.Key) int
}

// Admitter decides whether a request's client may reach the pod the
// throttle chose for it (netpol.Admitter: the NetworkPolicies of the
// target's namespace, applied on the pod's behalf, since the pod sees the
// activator's address and not the client's). An error wrapping
// netpol.ErrDenied refuses the request (403); any other leaves it
// undecided (503, retry).
type Admitter interface {
	Admit(ctx context.Context, client netip.Addr, key target.Key, dest netip.AddrPort) error
}

// Stats counts a target's requests from arrival to the end of the
// response (stats.Counter).
type Stats interface {
	Begin(key target.Key) (end func())
}

// Options configure the handler.
type Options struct {
	// PodName is this activator's pod name: the answer to activator
	// probes and the value of ProxiedHeader.
	PodName   string
	Resolver  Resolver
	Throttler Throttler
	Stats     Stats
	// Admitter, if set, is asked before every forward (nil: every client
	// may reach every target, --network-policies=ignore).
	Admitter Admitter
	// Modes, if set, moves kept-alive clients to the direct path: a
	// pod's response to one whose target has been in Serve mode for
	// ReconnectAfter asks it to reconnect (reconnect.go); Conns, attached
	// to the server, moves the idle ones. Nil: never (the route port;
	// --reconnect-served-clients=false).
	Modes          Modes
	ReconnectAfter time.Duration
	// Pool bounds the requests held by every port's handler together and
	// shares them fairly among namespaces (the wiring gives all handlers
	// one); nil: a pool of holdpool.DefaultCapacity for this handler.
	Pool *holdpool.Pool
	// Transport carries requests to pods over HTTP/1.1 (default
	// NewTransport()); H2CTransport to pods of targets marked H2C
	// (default NewH2CTransport()).
	Transport, H2CTransport http.RoundTripper
	// Metrics, if set, are counted into (several handlers, one per port,
	// share one set); else new ones are registered with Registerer.
	Metrics    *Metrics
	Registerer prometheus.Registerer
	Log        *slog.Logger
}

// New returns the activator's handler for the proxy port, or for the
// route port (Resolver a resolve.Picker with AllRevisions). The layers, in
// the order a request meets them:
//
//  1. refuseConnect: CONNECT asks for a tunnel to wherever the client
//     names; an activator only forwards to pods of known targets (405).
//  2. refuseLoop: a request that already carries ProxiedHeader has
//     passed an activator; forwarding it again could loop it between
//     activators, each hop adding headers (508 Loop Detected).
//  3. answerProbe: the controller's activator probe (internal/
//     activatorprobe) is answered here and never forwarded, whatever its
//     host: it proves that the public Service leads to an activator.
//  4. (*handler).ServeHTTP: resolve the target (404, or 400 for a
//     malformed Sockscale-Target; a Route's host chooses its revision
//     here, 503 when its status.traffic says nowhere to go), refuse an
//     absolute-form URI naming another host (400), answer one of the
//     target's health checks itself while it has no ready pod (not
//     counted, not held, no poke), take a place in the
//     pool of held requests (503 max_held when the activator holds its
//     most and the namespace its fair share; a held request of the
//     namespace holding the most may be shed, 503 shed, to make room for
//     another's), hold in the throttle until a pod of the target has a
//     free slot (503 queue full, 504 deadline), ask the Admitter whether
//     the client may reach that pod (403 network_policy; 503
//     network_policy_undecided while it cannot tell), forward to it.
//     The destination comes only from the throttle, whose addresses are
//     only the target's ready pods: no request can name where it goes.
//     With Modes set, the pod's response may ask a kept-alive client to
//     reconnect, when its target is served directly (reconnect.go).
func New(o Options) http.Handler {
	h := &handler{
		podName:   o.PodName,
		resolver:  o.Resolver,
		throttler: o.Throttler,
		stats:     o.Stats,
		admitter:  o.Admitter,
		modes:     o.Modes,
		pool:      o.Pool,
		m:         o.Metrics,
		log:       o.Log,

		reconnectAfter: o.ReconnectAfter,
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.m == nil {
		h.m = NewMetrics(o.Registerer)
	}
	if h.pool == nil {
		h.pool = holdpool.New(holdpool.Options{Capacity: holdpool.DefaultCapacity})
	}
	if o.Transport == nil {
		o.Transport = NewTransport()
	}
	if o.H2CTransport == nil {
		o.H2CTransport = NewH2CTransport()
	}
	h.http1 = h.reverseProxy(o.Transport)
	h.h2c = h.reverseProxy(o.H2CTransport)

	return h.refuseConnect(h.refuseLoop(h.answerProbe(h)))
}

type handler struct {
	podName   string
	resolver  Resolver
	throttler Throttler
	stats     Stats
	admitter  Admitter
	modes     Modes
	pool      *holdpool.Pool
	http1     *httputil.ReverseProxy
	h2c       *httputil.ReverseProxy
	m         *Metrics
	log       *slog.Logger

	reconnectAfter time.Duration
}

func (h *handler) refuseConnect(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect {
			w.Header().Set("Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
			h.fail(w, http.StatusMethodNotAllowed, reasonConnect, "CONNECT is refused: the activator forwards requests to the pods of known targets, it does not open tunnels")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// refuseLoop refuses what an activator sent: activators forward only to
// the pods Kubernetes computed for a target's private Service, so a
// request marked by an activator that reaches an activator is a loop, or
// a client's forgery, or an app that copies every incoming header onto its
// own calls (it must drop this one).
func (h *handler) refuseLoop(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v, ok := r.Header[ProxiedHeader]; ok {
			h.fail(w, http.StatusLoopDetected, reasonLoop, "the request carries %s %q: it was already forwarded by a sockscale activator, and an activator never forwards to an activator (an app that copies incoming headers onto its own calls must drop %s)",
				ProxiedHeader, strings.Join(v, ", "), ProxiedHeader)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (h *handler) answerProbe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if activatorprobe.IsProbe(r) {
			w.Header().Set(activatorprobe.ResponseHeader, h.podName)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = w.Write([]byte("sockscale-activator " + h.podName + "\n"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// ServeHTTP resolves, holds and forwards one request.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t, err := h.resolver.Resolve(r.Header.Get(resolve.Header), r.Host)
	if err != nil {
		switch {
		case errors.Is(err, resolve.ErrBadHeader):
			h.fail(w, http.StatusBadRequest, reasonBadTargetHeader, "%v", err)
		case errors.Is(err, resolve.ErrAmbiguous):
			h.fail(w, http.StatusNotFound, reasonAmbiguousTarget, "%v", err)
		case errors.Is(err, resolve.ErrRouteNotReady):
			// The Route exists (its Service does) but says nowhere to go
			// yet: the controller writes status.traffic shortly.
			w.Header().Set("Retry-After", "1")
			h.fail(w, http.StatusServiceUnavailable, reasonRouteNotReady, "%v", err)
		case errors.Is(err, resolve.ErrRevisionUnknown):
			w.Header().Set("Retry-After", "1")
			h.fail(w, http.StatusServiceUnavailable, reasonRouteRevisionUnknown, "%v", err)
		default:
			h.fail(w, http.StatusNotFound, reasonUnknownTarget, "%v", err)
		}
		return
	}
	// An absolute-form request ("GET http://host/ HTTP/1.1") names its
	// host in the URI, which Go has already made r.Host. With the
	// Sockscale-Target header naming the target, that host must still
	// lead to the target: anything else asks us to proxy elsewhere.
	// (Reaches, not a second Resolve: a Route's host chooses anew each
	// time.)
	if r.URL.Host != "" {
		if !h.resolver.Reaches(r.URL.Host, t.Key) {
			h.fail(w, http.StatusBadRequest, reasonAbsoluteURI, "the request URI names host %q, which is not target %s: the activator is not a forward proxy", r.URL.Host, t.Key)
			return
		}
	}

	// A load balancer's health check of a target with no ready pod is
	// answered here: it neither wakes the target nor counts as its load.
	if t.HealthChecks != nil && t.HealthChecks.Matches(r) && h.throttler.ReadyPods(t.Key) == 0 {
		h.answerHealthCheck(w, r, t)
		return
	}

	// Held from here. A client that leaves frees its place at once when
	// Go's server notices: at once for HTTP/2 (the stream is reset) and for
	// HTTP/1.1 requests without a body (the server reads the idle
	// connection and sees it close). An HTTP/1.1 request whose body is not
	// read yet cannot be told from a slow one; it keeps its place until it
	// is forwarded or its timeout ends.
	end := h.stats.Begin(t.Key)
	defer end()
	// The target's request timeout bounds the request from arrival to the
	// end of its response, holding included (Knative's timeoutSeconds).
	timeout := t.RequestTimeout()
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	// A pod that cannot be reached gets nothing, so the request can go to
	// another: the transport must not close the body it did not send, and
	// a body it began to send means the request is no longer whole.
	out := r.WithContext(ctx)
	var body *unsentBody
	if r.Body != nil && r.Body != http.NoBody {
		body = &unsentBody{ReadCloser: r.Body}
		out.Body = body
	}
	// Every namespace's held requests share one activator's memory: the
	// pool bounds them all together and keeps one tenant's flood from
	// taking another's place. Its place is freed when the request gets a
	// pod slot, fails or leaves; shedding it cancels holdCtx.
	holdCtx, held, err := h.pool.Hold(ctx, t.Key.Namespace)
	if err != nil {
		w.Header().Set("Retry-After", "2")
		h.fail(w, http.StatusServiceUnavailable, reasonMaxHeld, "%s: %v; retry later", t.Key, err)
		return
	}
	defer func() { _ = held.Release() }()
	client := clientAddr(r)
	reconnect := h.modes != nil && reconnectable(r)
	noteTarget(r, t.Key)
	err = h.throttler.Try(holdCtx, t.Key, func(slot throttle.Slot) error {
		dest := slot.Dest
		// The pod is known only now, so a client the target's
		// NetworkPolicies refuse was held like any other: its first
		// request can wake a target at zero (as a poke would), but it
		// never reaches a pod. The slot it took is freed when this returns.
		if h.admitter != nil {
			if err := h.admitter.Admit(ctx, client, t.Key, dest); err != nil {
				return err
			}
		}
		// No longer held once it has a slot, unless it was shed at the
		// same moment: then it must not reach the pod. (After a pod
		// that could not be reached, the request may wait again
		// without its place: briefly, at most 3 pods in a row,
		// and it was admitted once.)
		if err := held.Release(); err != nil {
			return err
		}
		proxy := h.http1
		if t.H2C {
			proxy = h.h2c
		}
		f := &forward{dest: dest, target: t, body: body, reconnect: reconnect, slot: slot}
		proxy.ServeHTTP(w, out.WithContext(context.WithValue(ctx, forwardKey{}, f)))
		if f.unreachable != nil {
			return fmt.Errorf("%w: %w", throttle.ErrPodUnreachable, f.unreachable)
		}
		return nil
	})
	if err != nil {
		h.holdFailed(w, r, t, timeout, err)
	}
}

// answerHealthCheck answers a health check of target t, which has no
// ready pod, with its configured status.
func (h *handler) answerHealthCheck(w http.ResponseWriter, r *http.Request, t *target.Target) {
	h.m.healthChecks.WithLabelValues(t.Key.Namespace).Inc()
	w.Header().Set(HealthCheckHeader, h.podName)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(t.HealthChecks.Status)
	if r.Method != http.MethodHead {
		_, _ = fmt.Fprintf(w, "sockscale-activator: health check of %s answered by the activator: the target has no ready pod, and is not woken for it\n", t.Key)
	}
}

// HealthCheckHeader marks a health check the activator answered itself
// (spec.activator.healthChecks); its value is the activator's pod name.
const HealthCheckHeader = "Sockscale-Health-Check"

// clientAddr is the address the request's connection comes from: for a
// pod calling a target, the pod's own (neither kube-proxy nor the
// connect-time redirect rewrites a pod's source address). Headers such as
// X-Forwarded-For are not read: a client writes them. An address that
// does not parse is the zero Addr, which is no pod and in no ipBlock.
func clientAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// holdFailed answers a request that got no pod slot, or got one its
// client may not reach.
func (h *handler) holdFailed(w http.ResponseWriter, r *http.Request, t *target.Target, timeout time.Duration, err error) {
	switch {
	case errors.Is(err, throttle.ErrQueueFull):
		// The queue drains as fast as pods answer and the decider acts
		// every 2 s on what it holds: come back after the next decision.
		w.Header().Set("Retry-After", "2")
		h.fail(w, http.StatusServiceUnavailable, reasonQueueFull, "%v; retry later", err)
	case errors.Is(err, holdpool.ErrShed):
		// Shed for another namespace's request: the pool frees places as
		// held requests are forwarded, come back after the next decision.
		w.Header().Set("Retry-After", "2")
		h.fail(w, http.StatusServiceUnavailable, reasonShed, "%s: %v; retry later", t.Key, err)
	case errors.Is(err, throttle.ErrDeadline):
		// 504, not 503 (docs/autoscaling.md, "The activator in the
		// path"): as a gateway the
		// activator got no upstream in time, and clients and dashboards
		// can tell "full, come back" from "waited and gave up" (issue 12
		// allows either).
		h.fail(w, http.StatusGatewayTimeout, reasonDeadline, "%v (the target's request timeout is %v)", err, timeout)
	case errors.Is(err, throttle.ErrTargetRemoved), errors.Is(err, throttle.ErrUnknownTarget):
		w.Header().Set("Retry-After", "1")
		h.fail(w, http.StatusServiceUnavailable, reasonTargetRemoved, "%v; retry later", err)
	case errors.Is(err, throttle.ErrPodUnreachable) && r.Context().Err() == nil:
		h.fail(w, http.StatusBadGateway, reasonPodUnreachable, "%s: %v", t.Key, err)
	case errors.Is(err, netpol.ErrDenied):
		h.fail(w, http.StatusForbidden, reasonNetworkPolicy, "%v; the request is not forwarded", err)
	case errors.Is(err, netpol.ErrUndecided):
		w.Header().Set("Retry-After", "1")
		h.fail(w, http.StatusServiceUnavailable, reasonNetworkPolicyUndecided, "%s: %v; retry later", t.Key, err)
	case errors.Is(err, ErrShuttingDown):
		shuttingDown(w)
		h.fail(w, http.StatusServiceUnavailable, reasonShuttingDown, "%s: the request was held and not forwarded; retry", ErrShuttingDown)
	case r.Context().Err() != nil:
		// The client is gone: nobody reads an answer.
		h.log.Debug("client left while held", "target", t.Key, "err", err)
	default:
		h.log.Error("hold failed", "target", t.Key, "err", err)
		h.fail(w, http.StatusInternalServerError, reasonInternal, "hold for %s: %v", t.Key, err)
	}
}

// shuttingDown asks an HTTP/1.1 client to reconnect (to another
// activator) rather than reuse this connection.
func shuttingDown(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	w.Header().Set("Retry-After", "1")
}

// fail writes an error the activator itself answers: a one-line plain
// text body saying what happened, and a count by reason.
func (h *handler) fail(w http.ResponseWriter, code int, reason, format string, args ...any) {
	h.m.responses.WithLabelValues(fmt.Sprint(code), reason).Inc()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = fmt.Fprintf(w, "sockscale-activator: "+format+"\n", args...)
}
