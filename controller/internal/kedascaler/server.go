package kedascaler

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"

	pb "github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sockscale/sockscale/internal/certfile"
)

// Options configure Serve.
//
// Whoever holds a client certificate from ClientCAFile may ask for any
// namespace's load: the namespace of a call is the one KEDA sends, the
// ScaledObject's. So the CA must sign KEDA's certificate and nothing a
// tenant can use, and KEDA's key must stay out of tenants' namespaces:
// give it in a ClusterTriggerAuthentication (caCert, tlsClientCert,
// tlsClientKey from a Secret in KEDA's namespace), which a ScaledObject
// names without reading, not in a namespaced TriggerAuthentication.
type Options struct {
	// CertFile and KeyFile are the serving key pair (PEM), loaded again
	// when the files change.
	CertFile, KeyFile string
	// ClientCAFile holds the CA certificates (PEM) that sign KEDA's
	// client certificate; a client without one is refused. Read again
	// when the file changes.
	ClientCAFile string
	// Insecure serves plaintext with no client authentication, for
	// development only: anyone who reaches the port reads any namespace's
	// load. The three files must then be empty.
	Insecure bool
	// Clock ticks the idle checks of open streams; nil is the real clock.
	Clock clock.WithTicker
}

// Limits of the gRPC server. Only KEDA calls it, with small requests,
// over one long-lived connection per scaler address.
const (
	// maxConcurrentStreams bounds the calls open at once on one
	// connection, each one goroutine. KEDA opens one StreamIsActive per
	// external-push trigger, all on one connection, and queues every
	// call past the bound (its polls too): the bound must be above the
	// cluster's count of such triggers.
	maxConcurrentStreams = 10_000
	// maxRequestBytes bounds a request: a ScaledObjectRef with its
	// metadata is well under 1 KiB.
	maxRequestBytes = 64 << 10
	// handshakeTimeout bounds a new connection's TLS handshake.
	handshakeTimeout = 10 * time.Second
)

// keepaliveParams: the server pings a connection idle for a minute and
// closes it when no answer comes within 20 s, so a stream whose KEDA died
// without closing its connection ends (and its goroutine with it).
var keepaliveParams = keepalive.ServerParameters{Time: time.Minute, Timeout: 20 * time.Second}

// keepalivePolicy: KEDA's client sends no pings of its own; one that pings
// more often than every 10 s is told to go away (GOAWAY too_many_pings)
// rather than keep the server busy. Pings on a connection with no call
// are allowed: KEDA's connections idle between polls.
var keepalivePolicy = keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}

// Serve answers KEDA's external scaler calls on lis with the loads of
// source until ctx ends. Then it ends the open streams, waits for the
// calls in flight and returns nil. It closes lis, also when the options
// are wrong.
func Serve(ctx context.Context, lis net.Listener, source Source, opts Options) error {
	creds, err := opts.credentials()
	if err != nil {
		_ = lis.Close() // the options' error is the one to report
		return err
	}
	if opts.Insecure {
		log.FromContext(ctx).Info("KEDA external scaler serves PLAINTEXT with no client authentication: anyone who reaches it reads any namespace's load; for development only",
			"address", lis.Addr().String())
	}
	clk := opts.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	srv := grpc.NewServer(
		grpc.Creds(creds),
		grpc.MaxConcurrentStreams(maxConcurrentStreams),
		grpc.MaxRecvMsgSize(maxRequestBytes),
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.KeepaliveParams(keepaliveParams),
		grpc.KeepaliveEnforcementPolicy(keepalivePolicy),
	)
	stopping := make(chan struct{})
	pb.RegisterExternalScalerServer(srv, &scaler{source: source, clock: clk, stop: stopping})

	served, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-ctx.Done():
		case <-served: // the listener failed
		}
		close(stopping)
		srv.GracefulStop()
	}()
	err = srv.Serve(lis)
	close(served)
	<-stopped
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("serve KEDA external scaler on %s: %w", lis.Addr(), err)
	}
	return nil
}

// credentials are mutual TLS with the files of o, or plaintext when o
// says Insecure.
func (o Options) credentials() (credentials.TransportCredentials, error) {
	if o.Insecure {
		if o.CertFile != "" || o.KeyFile != "" || o.ClientCAFile != "" {
			return nil, errors.New("KEDA external scaler: Insecure serves plaintext: give no certificate, key or client CA file")
		}
		return insecure.NewCredentials(), nil
	}
	if o.CertFile == "" || o.KeyFile == "" || o.ClientCAFile == "" {
		return nil, fmt.Errorf("KEDA external scaler: want a certificate file, a key file and a client CA file, got %q, %q and %q (Insecure serves plaintext, for development)",
			o.CertFile, o.KeyFile, o.ClientCAFile)
	}
	pair, err := certfile.Load(o.CertFile, o.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("KEDA external scaler %w", err)
	}
	cas, err := loadClientCAs(o.ClientCAFile)
	if err != nil {
		return nil, fmt.Errorf("KEDA external scaler %w", err)
	}
	// Each handshake gets a config with the CA pool as the file is now
	// (gRPC adds its ALPN protocol, h2). No session tickets: a resumed
	// session would skip checking the client against the current pool.
	return credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return &tls.Config{
				MinVersion:             tls.VersionTLS12,
				GetCertificate:         pair.GetCertificate,
				ClientAuth:             tls.RequireAndVerifyClientCert,
				ClientCAs:              cas.pool(),
				SessionTicketsDisabled: true,
			}, nil
		},
	}), nil
}
