package testpod

import (
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/sockscale/sockscale/internal/testutil/grpcsleep"
)

// The gRPC role's methods: the Sleep service of package grpcsleep.
const (
	// GRPCUnary answers one request.
	GRPCUnary = grpcsleep.Unary
	// GRPCStream answers each request of a bidirectional stream until the
	// client ends it.
	GRPCStream = grpcsleep.Stream
	// GRPCMaxConnectionAge is how long the server keeps a connection
	// before it sends GOAWAY (calls in flight on it finish), so that
	// every test that runs longer sees connections go away under load.
	GRPCMaxConnectionAge = 3 * time.Second
)

// serveGRPC serves GRPCUnary, GRPCStream and the standard health service
// over HTTP/2 without TLS, as gRPC servers in a cluster do.
func serveGRPC(port string) error {
	l, err := net.Listen("tcp", ":"+port)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: GRPCMaxConnectionAge, MaxConnectionAgeGrace: time.Minute}),
	)
	grpcsleep.Register(srv)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	return srv.Serve(l)
}
