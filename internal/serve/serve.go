package serve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// MaxHeaderBytes bounds a request's header section (request line
// included; Go adds 4 KiB of slack). Larger headers get 431 Request Header
// Fields Too Large. 64 KiB: Envoy's default limit is 60 KiB, nginx's
// 32 KiB; Go's own default, 1 MiB, lets each connection pin a megabyte.
const MaxHeaderBytes = 64 << 10

// Timeouts of the small endpoints (metrics, health, stats): none of their
// requests needs longer, and a client that is slower only holds a
// connection and a goroutine that long.
const (
	// ReadHeaderTimeout ends a connection whose headers have not all
	// arrived (slowloris): 10 s is ample for a scraper or a probe.
	ReadHeaderTimeout = 10 * time.Second
	// ReadTimeout bounds the whole request, body included.
	ReadTimeout = 30 * time.Second
	// WriteTimeout bounds a response to a client that reads it slowly
	// (a /metrics page is a few hundred kB at most).
	WriteTimeout = 60 * time.Second
	// IdleTimeout closes keep-alive connections with no request: a
	// scraper every 15 s reuses its connection, a crowd of idle ones goes.
	IdleTimeout = 90 * time.Second
)

// New returns the server of a small endpoint on addr: bounded headers and
// timeouts on every phase. Oversized headers are answered 431, malformed
// requests 400, by net/http itself.
func New(addr string, h http.Handler) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes,
	}
}

// Serve listens on addr with New's server until ctx ends, then gives
// requests in flight five seconds to finish.
func Serve(ctx context.Context, addr string, h http.Handler) error {
	return Server(ctx, New(addr, h))
}

// Server is Serve for a server whose limits the caller sets; with a
// TLSConfig (its GetCertificate or Certificates set) it serves HTTPS.
func Server(ctx context.Context, srv *http.Server) error {
	ln, err := net.Listen("tcp", srv.Addr)
	if err != nil {
		return fmt.Errorf("serve %s: %w", srv.Addr, err)
	}
	return On(ctx, ln, srv)
}

// On serves srv on ln until ctx ends, then gives requests in
// flight five seconds to finish; HTTPS when srv has a TLSConfig.
func On(ctx context.Context, ln net.Listener, srv *http.Server) error {
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-ctx.Done():
		case <-stopped:
			return
		}
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	serve := srv.Serve
	if srv.TLSConfig != nil {
		serve = func(ln net.Listener) error { return srv.ServeTLS(ln, "", "") }
	}
	if err := serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve %s: %w", ln.Addr(), err)
	}
	return nil
}
