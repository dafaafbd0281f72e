package grpcsleep

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// dial serves the service on a loopback listener and returns a client
// connection to it.
func dial(t *testing.T) *grpc.ClientConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	Register(srv)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// A call is answered with its request after the wait it names; a value
// that is no duration waits nothing. Only lower bounds are checked.
func TestUnary(t *testing.T) {
	conn := dial(t)
	for _, tt := range []struct {
		req     string
		atLeast time.Duration
	}{{"50ms", 50 * time.Millisecond}, {"0s", 0}, {"hello", 0}} {
		start := time.Now()
		var resp wrapperspb.StringValue
		if err := conn.Invoke(context.Background(), Unary, wrapperspb.String(tt.req), &resp); err != nil {
			t.Fatalf("call %q: %v", tt.req, err)
		}
		if resp.Value != tt.req {
			t.Errorf("call %q: answered %q, want the request", tt.req, resp.Value)
		}
		if d := time.Since(start); d < tt.atLeast {
			t.Errorf("call %q took %s, want >= %s", tt.req, d, tt.atLeast)
		}
	}
}

// A stream answers each of its requests in turn until the client ends it.
func TestStream(t *testing.T) {
	conn := dial(t)
	s, err := conn.NewStream(context.Background(), &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, Stream)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, req := range []string{"1ms", "x", "2ms"} {
		if err := s.SendMsg(wrapperspb.String(req)); err != nil {
			t.Fatal(err)
		}
		var resp wrapperspb.StringValue
		if err := s.RecvMsg(&resp); err != nil {
			t.Fatal(err)
		}
		got = append(got, resp.Value)
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := s.RecvMsg(new(wrapperspb.StringValue)); !errors.Is(err, io.EOF) {
		t.Errorf("after CloseSend: %v, want the stream's end", err)
	}
	if diff := cmp.Diff([]string{"1ms", "x", "2ms"}, got); diff != "" {
		t.Errorf("answers (-want +got):\n%s", diff)
	}
}

// A client that gives up ends its sleeping call; another method of the
// service is not one.
func TestCancelAndUnknown(t *testing.T) {
	conn := dial(t)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := conn.Invoke(ctx, Unary, wrapperspb.String("10m"), new(wrapperspb.StringValue))
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("call of 10m with a 50ms deadline: %v, want DeadlineExceeded", err)
	}
	err = conn.Invoke(context.Background(), "/"+Service+"/Other", wrapperspb.String("1ms"), new(wrapperspb.StringValue))
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("unknown method: %v, want Unimplemented", err)
	}
}
