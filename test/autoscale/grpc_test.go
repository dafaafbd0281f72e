package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sockscale/sockscale/internal/testutil/grpcsleep"
)

// dialGRPC is a gRPC client of addr over h2c, as grpc-go clients in a
// cluster are.
func dialGRPC(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// healthStatus is the health service's overall status, as the kubelet's
// gRPC probe asks for it (service "").
func healthStatus(t *testing.T, conn *grpc.ClientConn) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("health check: %v", err)
	}
	return resp.Status
}

// callResult is one Sleep call's outcome.
type callResult struct {
	value  string
	header metadata.MD
	err    error
}

func call(conn *grpc.ClientConn, sleep string) callResult {
	var resp wrapperspb.StringValue
	var md metadata.MD
	err := conn.Invoke(context.Background(), grpcsleep.Unary, wrapperspb.String(sleep), &resp, grpc.Header(&md))
	return callResult{value: resp.Value, header: md, err: err}
}

// The gRPC server of --grpc-port as main runs it, beside the HTTP one:
// the health service says NOT_SERVING during the startup delay and
// SERVING once ready, as /healthz does; Sleep calls are answered with
// the pod and the calls in flight in their header, many at once on one
// connection; after SIGTERM the health service says NOT_SERVING while a
// call in flight completes before serve returns.
func TestGRPCServer(t *testing.T) {
	ln, gln := listen(t), listen(t)
	a := newApp()
	ctx, sigterm := context.WithCancel(context.Background())
	defer sigterm()
	o := options{startupDelay: time.Hour, shutdownDelay: time.Second, drainTimeout: time.Minute}
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, gln, a, o) }()
	conn := dialGRPC(t, gln.Addr().String())

	if got := healthStatus(t, conn); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("during the startup delay: health %s, want NOT_SERVING", got)
	}
	// The startup delay is an hour: mark ready as its timer would
	// (TestStartupDelayEnds covers the timer). serve made the health
	// service before it could be asked, so a.health is set.
	a.setReady(true)
	if got := healthStatus(t, conn); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("ready: health %s, want SERVING", got)
	}
	if code := status(t, "http://"+ln.Addr().String()+"/healthz"); code != http.StatusOK {
		t.Errorf("ready: /healthz %d, want 200", code)
	}

	// Three calls at once on the one connection: each is in flight while
	// the others are, and the last to start says 3.
	results := make(chan callResult, 3)
	for range 3 {
		go func() { results <- call(conn, "300ms") }()
	}
	waitFor(t, func() bool { return a.inFlight.Load() == 3 })
	var inFlight []string
	for range 3 {
		r := <-results
		if r.err != nil || r.value != "300ms" {
			t.Fatalf("call: %q %v, want the request back", r.value, r.err)
		}
		if diff := cmp.Diff([]string{"autoscale-0"}, r.header.Get(PodMetadata)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", PodMetadata, diff)
		}
		inFlight = append(inFlight, r.header.Get(InFlightMetadata)...)
	}
	if !strings.Contains(strings.Join(inFlight, ","), "3") {
		t.Errorf("%s of three overlapping calls: %v, want one of them 3", InFlightMetadata, inFlight)
	}

	// A call in flight when SIGTERM comes.
	slow := make(chan callResult, 1)
	go func() { slow <- call(conn, "2s") }()
	waitFor(t, func() bool { return a.inFlight.Load() == 1 })
	sigterm()
	waitFor(t, func() bool { return !a.ready.Load() })
	if got := healthStatus(t, conn); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("draining: health %s, want NOT_SERVING", got)
	}
	if r := <-slow; r.err != nil || r.value != "2s" {
		t.Errorf("call in flight at SIGTERM: %q %v, want it answered", r.value, r.err)
	}
	if err := <-done; err != nil {
		t.Errorf("serve: %v", err)
	}
}

// A call longer than --drain-timeout is cut off and serve says so, as for
// an HTTP request.
func TestGRPCDrainTimeout(t *testing.T) {
	ln, gln := listen(t), listen(t)
	a := newApp()
	ctx, sigterm := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, gln, a, options{drainTimeout: 50 * time.Millisecond}) }()
	conn := dialGRPC(t, gln.Addr().String())
	slow := make(chan callResult, 1)
	go func() { slow <- call(conn, "10m") }()
	waitFor(t, func() bool { return a.inFlight.Load() == 1 })
	sigterm()
	err := <-done
	if err == nil || !strings.Contains(err.Error(), "1 requests still in flight after 50ms") {
		t.Errorf("serve: %v, want the drain timeout with 1 call in flight", err)
	}
	if r := <-slow; r.err == nil {
		t.Errorf("cut-off call: %q, want an error", r.value)
	}
}

// The port serves gRPC's HTTP/2 only: an HTTP/1.1 request there gets no
// answer (grpc-go closes a connection that does not start with HTTP/2's
// preface), which is why a prober must speak h2c to it.
func TestGRPCPortIsHTTP2Only(t *testing.T) {
	ln, gln := listen(t), listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, gln, newApp(), options{drainTimeout: 5 * time.Second}) }()
	if r := fetch("http://" + gln.Addr().String() + "/"); r.err == nil {
		t.Errorf("HTTP/1.1 GET on the gRPC port: %d %q, want no answer", r.code, r.body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("serve: %v", err)
	}
}
