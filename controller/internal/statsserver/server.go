package statsserver

import (
	"context"
	"net/http"

	"github.com/sockscale/sockscale/internal/serve"
	"github.com/sockscale/sockscale/internal/stats"
)

// Server serves Handler at stats.Path on every replica.
type Server struct {
	Addr    string
	Handler http.Handler
}

// NeedLeaderElection is false: every replica takes stats, leader or not,
// so a standby has warm windows.
func (s *Server) NeedLeaderElection() bool { return false }

// Start serves until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	mux := http.NewServeMux()
	mux.Handle(stats.Path, s.Handler)
	return serve.Serve(ctx, s.Addr, mux)
}
