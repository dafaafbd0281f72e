package testpod

import (
	"errors"
	"io"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The gRPC role's methods. Their messages are google.protobuf.StringValue:
// a request names how long to wait before the answer (a Go duration), and
// the answer is the request.
const (
	// GRPCUnary answers one request.
	GRPCUnary = "/sockscale.test.Sleep/Call"
	// GRPCStream answers each request of a bidirectional stream until the
	// client ends it.
	GRPCStream = "/sockscale.test.Sleep/Stream"
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
		grpc.UnknownServiceHandler(sleepHandler),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	return srv.Serve(l)
}

// sleepHandler serves both methods: a stream of requests, each answered
// after the wait it names; a unary call is a stream of one.
func sleepHandler(_ any, stream grpc.ServerStream) error {
	method, _ := grpc.MethodFromServerStream(stream)
	for {
		var req wrapperspb.StringValue
		if err := stream.RecvMsg(&req); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		if d, err := time.ParseDuration(req.Value); err == nil {
			select {
			case <-time.After(d):
			case <-stream.Context().Done():
				return stream.Context().Err()
			}
		}
		if err := stream.SendMsg(&req); err != nil {
			return err
		}
		if method != GRPCStream {
			return nil
		}
	}
}
