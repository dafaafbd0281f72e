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

// Server is Serve for a server whose limits the caller sets.
func Server(ctx context.Context, srv *http.Server) error {
	addr := srv.Addr
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve %s: %w", addr, err)
	}
	return nil
}
