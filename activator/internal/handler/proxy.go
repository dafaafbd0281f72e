package handler

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sockscale/sockscale/activator/internal/resolve"
	"github.com/sockscale/sockscale/activator/internal/target"
	"github.com/sockscale/sockscale/activator/internal/throttle"
)

// forward is where the throttle sent a request, carried in its context
// to the ReverseProxy's Rewrite and ErrorHandler, and what became of it.
type forward struct {
	dest   netip.AddrPort
	target *target.Target
	body   *unsentBody // nil: the request has no body
	// unreachable is set by the ErrorHandler, instead of answering, when
	// the pod could not be reached and nothing was sent: the request can
	// go to another pod.
	unreachable error
	// reconnect: the client's connection may be asked to reconnect after
	// the pod's response (askReconnect).
	reconnect bool
	// slot is how the request came by its pod (a cold start: coldStart).
	slot throttle.Slot
}

// unsentBody is a request body that the transport may not close (it does
// on a failed dial, and the request could not go to another pod then) and
// that remembers whether any of it was read.
type unsentBody struct {
	io.ReadCloser
	read bool
}

func (b *unsentBody) Read(p []byte) (int, error) {
	b.read = true
	return b.ReadCloser.Read(p)
}

// Close leaves the body to the server, which closes it after the handler.
func (b *unsentBody) Close() error { return nil }

// unsent says whether the request may go to another pod after err: the
// transport reached no pod and sent nothing (the dial failed: refused, no
// route, timed out) before a byte of the request was written; or the pod
// closed or reset the connection without a byte of answer to a request
// with no body and an idempotent method, which RFC 9110 (9.2.2) lets a
// client send again. The second is a kept-alive connection the pod closed
// as the request went out on it: a leaving pod's drain closes its idle
// connections, and a pod's own idle timeout does the same; Go's transport
// resends such a request itself only when none of it was written yet.
func (f *forward) unsent(r *http.Request, err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return f.body == nil || !f.body.read
	}
	return f.body == nil && idempotent(r.Method) &&
		(errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE))
}

// idempotent says whether a request of method m may be sent twice with
// the effect of once (RFC 9110, 9.2.2; PUT and DELETE carry what they
// change, and are not resent here either).
func idempotent(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

type forwardKey struct{}

// NewTransport returns the transport to pods over HTTP/1.1: keep-alive
// pools per pod, no proxy from the environment (requests go to pods and
// nowhere else), no transparent compression (the client's Accept-Encoding
// and the pod's answer pass unchanged).
func NewTransport() *http.Transport {
	return &http.Transport{
		Proxy: nil,
		DialContext: (&net.Dialer{
			// A ready pod accepts at once; a pod that just vanished should
			// fail fast into a 502 rather than use up the request timeout.
			Timeout:   3 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		// Held requests are released in bursts when a pod becomes ready:
		// keep enough idle connections per pod that the next burst finds
		// them open (the default of 2 would reconnect most of them).
		MaxIdleConnsPerHost: 100,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
}

// NewH2CTransport returns the transport to pods that speak HTTP/2 without
// TLS (gRPC servers): one multiplexed connection per pod.
func NewH2CTransport() *http.Transport {
	t := NewTransport()
	t.Protocols = new(http.Protocols)
	t.Protocols.SetUnencryptedHTTP2(true)
	return t
}

// reverseProxy forwards to the pod in the request's context. It streams
// (every write is flushed at once: server-sent events and long polls must
// not wait in a buffer), passes trailers, and switches protocols
// (websockets) by hijacking both connections. httputil.ReverseProxy
// removes hop-by-hop headers, those named in Connection included, in both
// directions; modifyResponse may then add "Connection: close" and the
// cold-start header to the client's response.
func (h *handler) reverseProxy(rt http.RoundTripper) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite:        h.rewrite,
		ModifyResponse: h.modifyResponse,
		Transport:      rt,
		FlushInterval:  -1,
		BufferPool:     copyBuffers,
		ErrorHandler:   h.proxyError,
		ErrorLog:       slog.NewLogLogger(h.log.Handler(), slog.LevelWarn),
	}
}

// copyBuffers recycles the buffers that copy response bodies. Without a
// pool ReverseProxy allocates 32 KB per request: measured in make bench,
// 39.7 KB allocated per forwarded request, a fifth of the activator's CPU
// in GC, and more CPU per request than queue-proxy; with the pool, 7.7 KB
// and 0.70-0.81 of queue-proxy's CPU per request.
var copyBuffers httputil.BufferPool = &bufferPool{}

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if buf, ok := b.p.Get().(*[]byte); ok {
		return *buf
	}
	return make([]byte, 32<<10)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

func (h *handler) rewrite(pr *httputil.ProxyRequest) {
	f := pr.In.Context().Value(forwardKey{}).(*forward)
	pr.SetURL(&url.URL{Scheme: "http", Host: f.dest.String()})
	// The pod sees the host the client asked for, not its own address:
	// applications that route or build links by Host keep working.
	pr.Out.Host = pr.In.Host
	// Rewrite starts without X-Forwarded-* and Forwarded. Keep what a
	// proxy in front of us set (an ingress that ended TLS knows the proto)
	// and add the client to X-Forwarded-For.
	pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
	pr.SetXForwarded()
	for _, k := range []string{"X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded"} {
		if v := pr.In.Header[k]; len(v) > 0 {
			pr.Out.Header[k] = v
		}
	}
	// Request trailers arrive after the body; the server fills them into
	// In.Trailer when the body hits EOF, and the transport writes
	// Out.Trailer after it read the body to EOF. Out has a copy taken
	// before: share In's map so the values make it through.
	pr.Out.Trailer = pr.In.Trailer
	pr.Out.Header.Set(ProxiedHeader, h.podName)
	pr.Out.Header.Del(resolve.Header) // ours, and spent
	disarmProbeAgents(pr.Out.Header)
}

// probeAgents are the User-Agent prefixes the node agents' kernel programs
// take for health probes (bpf/lib/message.h), matched as they match them:
// case-sensitive, after leading spaces.
var probeAgents = []string{"kube-probe/", "sockscale-probe/"}

// disarmedPrefix goes in front of a client's probe User-Agent.
const disarmedPrefix = "forwarded-by-sockscale-activator "

// disarmProbeAgents keeps a client's User-Agent from passing for a health
// probe at the pod. The agents believe a probe's User-Agent only on
// connections from the node or from an activator (whose own prober sends
// one); a request the activator forwards comes from the activator, so a
// client could otherwise hide its load behind the header by calling
// through the activator. The kubelet probes pods directly, never through
// an activator: no real probe is changed.
func disarmProbeAgents(h http.Header) {
	for i, v := range h["User-Agent"] {
		t := strings.TrimLeft(v, " \t")
		for _, p := range probeAgents {
			if strings.HasPrefix(t, p) {
				h["User-Agent"][i] = disarmedPrefix + t
				break
			}
		}
	}
}

// proxyError answers a request whose pod did not answer. Timeouts are
// told apart by the request's context, not by err: a dial timeout also
// matches context.DeadlineExceeded, and is the pod's failure (502), not
// the target's request timeout running out (504).
func (h *handler) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	f := r.Context().Value(forwardKey{}).(*forward)
	switch {
	case r.Context().Err() == nil && f.unsent(r, err):
		// Not answered here: Try hands the request to another pod.
		f.unreachable = err
	case errors.Is(context.Cause(r.Context()), ErrShuttingDown):
		shuttingDown(w)
		h.fail(w, http.StatusServiceUnavailable, reasonShuttingDown, "%s before pod %s of %s answered; retry", ErrShuttingDown, f.dest, f.target.Key)
	case errors.Is(r.Context().Err(), context.DeadlineExceeded):
		h.fail(w, http.StatusGatewayTimeout, reasonPodTimeout, "pod %s of %s did not answer within the request timeout of %v", f.dest, f.target.Key, f.target.RequestTimeout())
	case r.Context().Err() != nil:
		h.log.Debug("client left while forwarded", "target", f.target.Key, "pod", f.dest)
	default:
		h.log.Warn("forward failed", "target", f.target.Key, "pod", f.dest, "err", err)
		h.fail(w, http.StatusBadGateway, reasonPodError, "forward to pod %s of %s: %v", f.dest, f.target.Key, err)
	}
}
