package handler

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/sockscale/sockscale/internal/serve"
)

// NewServer returns the proxy port's server: HTTP/1.1 and HTTP/2 without
// TLS (h2c with prior knowledge, as gRPC clients speak it; the older
// "Upgrade: h2c" dance is not offered). Every request's context derives
// from base: cancelling base with cause ErrShuttingDown ends held requests
// with a 503 saying so.
func NewServer(addr string, h http.Handler, base context.Context) *http.Server {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return &http.Server{
		Addr:      addr,
		Handler:   h,
		Protocols: p,
		// No read or write timeout: requests are held and streamed up to
		// their target's timeout, which the handler enforces.
		ReadHeaderTimeout: serve.ReadHeaderTimeout,
		IdleTimeout:       serve.IdleTimeout,
		// Larger headers get 431 here rather than a megabyte (Go's
		// default) pinned per connection and then refused by the pod.
		MaxHeaderBytes: serve.MaxHeaderBytes,
		BaseContext:    func(net.Listener) context.Context { return base },
		HTTP2: &http.HTTP2Config{
			// Go's default, written out so an upgrade cannot change it
			// unseen; gRPC clients queue calls beyond it. What the
			// streams hold in memory is bounded by the held-request pool
			// and by the windows below, not by this.
			MaxConcurrentStreams: MaxConcurrentStreams,
			// A held request's body is not read until it is forwarded, so
			// whatever the client sends within its window stays in the
			// activator's memory. Go's default windows are 1 MiB per
			// stream and per connection: one held stream could pin a
			// megabyte. 64 KiB per stream is HTTP/2's own initial window,
			// which every client is written for (gRPC's too), and at
			// in-cluster round trips still carries tens of MB/s per
			// stream; holdpool.RequestCost counts it.
			MaxReceiveBufferPerStream: MaxReceiveBufferPerStream,
			// Half Go's default: eight held streams' full windows before
			// the connection's uploads wait for one to be forwarded; gRPC
			// unary messages are mostly far smaller than a window.
			MaxReceiveBufferPerConnection: MaxReceiveBufferPerConnection,
		},
	}
}

// The h2c bounds of NewServer: what one stream and one connection may
// have sent and not yet had read, and the streams open on one connection.
const (
	MaxReceiveBufferPerStream     = 64 << 10
	MaxReceiveBufferPerConnection = 512 << 10
	MaxConcurrentStreams          = 250
)

// Health serves /healthz and /readyz on the health port. Readiness fails
// as soon as Drain is called, so the activator leaves its Service's
// endpoints before it stops taking requests.
type Health struct {
	// Ready, if set, says why the activator cannot serve yet (nil: it
	// can); /readyz fails while it returns an error.
	Ready func() error

	draining atomic.Bool
}

// Drain makes /readyz fail from now on.
func (h *Health) Drain() { h.draining.Store(true) }

// Handler serves /healthz (alive while the process serves) and /readyz.
func (h *Health) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if h.draining.Load() {
			http.Error(w, "draining: the activator is shutting down", http.StatusServiceUnavailable)
			return
		}
		if h.Ready != nil {
			if err := h.Ready(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// Drain stops the proxy servers srvs (the proxy port's and the route
// port's) without dropping what they hold, within grace of the call:
//
//  1. readiness fails at once (health.Drain): the activator leaves its
//     Service's endpoints and the controller's choice of activators;
//  2. for drainDelay it keeps serving, new requests included, while
//     endpoints and the agents' redirect maps catch up;
//  3. it stops accepting and waits for held and forwarded requests to end,
//     until the last second of grace (a tenth of it if grace is shorter
//     than 10 s);
//  4. then it cancels what is left (stopRequests with ErrShuttingDown):
//     held requests answer 503 saying the activator is shutting down, so
//     the client retries through another one; forwarded requests and
//     websockets are cut. It gives those answers the rest of grace, then
//     closes every connection.
//
// With the defaults (drain delay 5 s, grace 30 s): requests arriving in
// the first 5 s are served, held requests have until 29 s to get a pod,
// and the process is done by 30 s; the pod's terminationGracePeriodSeconds
// must be longer than grace.
func Drain(srvs []*http.Server, health *Health, stopRequests context.CancelCauseFunc, drainDelay, grace time.Duration, log *slog.Logger) {
	end := time.Now().Add(grace)
	last := min(time.Second, grace/10)
	health.Drain()
	log.Info("draining: readiness fails, still serving", "drainDelay", drainDelay, "grace", grace)
	time.Sleep(drainDelay)

	ctx, cancel := context.WithDeadline(context.Background(), end.Add(-last))
	defer cancel()
	err := shutdown(ctx, srvs)
	// Hijacked connections (websockets) are not waited for by Shutdown:
	// ending the requests' context closes them too.
	stopRequests(ErrShuttingDown)
	if err == nil {
		log.Info("drained: every request ended")
		return
	}
	log.Warn("grace period ending: held requests answered 503, forwarded ones cut", "err", err)
	ctx, cancel = context.WithDeadline(context.Background(), end)
	defer cancel()
	if err := shutdown(ctx, srvs); err != nil {
		for _, srv := range srvs {
			_ = srv.Close()
		}
	}
}

// shutdown shuts the servers down at once, each waiting for its own
// requests until ctx ends.
func shutdown(ctx context.Context, srvs []*http.Server) error {
	errs := make(chan error, len(srvs))
	for _, srv := range srvs {
		go func() { errs <- srv.Shutdown(ctx) }()
	}
	var all []error
	for range srvs {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}
