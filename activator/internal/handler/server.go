package handler

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"time"
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
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       90 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return base },
	}
}

// Health serves /healthz and /readyz on the health port. Readiness fails
// as soon as Drain is called, so the activator leaves its Service's
// endpoints before it stops taking requests.
type Health struct {
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
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}
