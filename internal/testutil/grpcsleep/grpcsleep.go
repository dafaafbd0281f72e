package grpcsleep

import (
	"errors"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The service's methods. Their messages are google.protobuf.StringValue
// (no generated code on either side): a request names how long to wait
// before the answer (a Go duration; anything else waits nothing), and
// the answer is the request.
const (
	// Service is the service's full name.
	Service = "sockscale.test.Sleep"
	// Unary answers one request.
	Unary = "/" + Service + "/Call"
	// Stream answers each request of a bidirectional stream until the
	// client ends it.
	Stream = "/" + Service + "/Stream"
)

// Register adds the service to s.
func Register(s grpc.ServiceRegistrar) {
	s.RegisterService(&desc, struct{}{})
}

// desc declares both methods as streams: the server reads a unary call as
// a stream of one request, which is what it is on the wire, so one
// handler serves both without generated code.
var desc = grpc.ServiceDesc{
	ServiceName: Service,
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{
		{StreamName: "Call", Handler: func(_ any, s grpc.ServerStream) error { return sleep(s, false) }, ServerStreams: true, ClientStreams: true},
		{StreamName: "Stream", Handler: func(_ any, s grpc.ServerStream) error { return sleep(s, true) }, ServerStreams: true, ClientStreams: true},
	},
}

// sleep answers each request after the wait it names; a unary call (many
// false) ends after its one answer.
func sleep(stream grpc.ServerStream, many bool) error {
	for {
		var req wrapperspb.StringValue
		if err := stream.RecvMsg(&req); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		if d, err := time.ParseDuration(req.Value); err == nil && d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-stream.Context().Done():
				t.Stop()
				return stream.Context().Err()
			}
		}
		if err := stream.SendMsg(&req); err != nil {
			return err
		}
		if !many {
			return nil
		}
	}
}
