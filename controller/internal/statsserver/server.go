package statsserver

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"time"

	"github.com/sockscale/sockscale/internal/certfile"
	"github.com/sockscale/sockscale/internal/serve"
	"github.com/sockscale/sockscale/internal/stats"
)

// Server serves Handler at stats.Path on every replica.
type Server struct {
	Addr    string
	Handler http.Handler
	// CertFile and KeyFile, when set, serve HTTPS with this pair (PEM),
	// loaded again when the files change: the senders' tokens then never
	// cross the pod network in clear.
	CertFile, KeyFile string
}

// NeedLeaderElection is false: every replica takes stats, leader or not,
// so a standby has warm windows.
func (s *Server) NeedLeaderElection() bool { return false }

// MaxHeaderBytes bounds a request's headers: a token is 1-2 KB, the node
// state well under 1 KB. Larger headers get 431 before any handler runs.
const MaxHeaderBytes = 16 << 10

// Start serves until ctx ends. Every stage of a request has a deadline,
// so a sender that trickles bytes holds a connection for seconds, not
// for ever: the headers (where the token is) within 10 s, the whole
// batch (at most stats.MaxBatchBytes, read only once its sender is
// authenticated) within 30 s. Idle keep-alive connections (each agent
// keeps one per replica, posting every second) close after 2 minutes.
func (s *Server) Start(ctx context.Context) error {
	mux := http.NewServeMux()
	mux.Handle(stats.Path, s.Handler)
	srv := &http.Server{Addr: s.Addr, Handler: mux, MaxHeaderBytes: MaxHeaderBytes,
		ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	if s.CertFile != "" || s.KeyFile != "" {
		certs, err := certfile.Load(s.CertFile, s.KeyFile)
		if err != nil {
			return fmt.Errorf("stats %w", err)
		}
		srv.TLSConfig = &tls.Config{GetCertificate: certs.GetCertificate, MinVersion: tls.VersionTLS12}
	}
	return serve.Server(ctx, srv)
}
