package serve

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Serve listens on addr until ctx ends, then gives requests in flight five
// seconds to finish.
func Serve(ctx context.Context, addr string, h http.Handler) error {
	return Server(ctx, &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second})
}

// Server is Serve for a server whose limits the caller sets; with a
// TLSConfig (its GetCertificate or Certificates set) it serves HTTPS.
func Server(ctx context.Context, srv *http.Server) error {
	addr := srv.Addr
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	listen := srv.ListenAndServe
	if srv.TLSConfig != nil {
		listen = func() error { return srv.ListenAndServeTLS("", "") }
	}
	if err := listen(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve %s: %w", addr, err)
	}
	return nil
}
