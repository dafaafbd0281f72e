package main

import (
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/sockscale/sockscale/internal/testutil/grpcsleep"
)

// The Sleep calls' header metadata: the gRPC counterparts of the HTTP
// answers' body ("pod <name>: ...") and InFlightHeader, so a client
// knows which pod answered and how busy it was.
const (
	PodMetadata      = "x-pod"
	InFlightMetadata = "x-in-flight"
)

// grpcServer returns the server of --grpc-port: the Sleep service
// (grpcsleep) and the standard health service, whose overall status ("",
// what the kubelet's gRPC probe asks by default) follows the app's
// readiness from now on (setReady). Sleep calls count in flight as
// requests to / do. No MaxConnectionAge: a client's one connection
// carries all its calls for as long as it likes, as a long-lived gRPC
// channel does, so a test sees many streams on one connection.
func (a *app) grpcServer() *grpc.Server {
	a.health = health.NewServer()
	a.setReady(a.ready.Load())
	s := grpc.NewServer(grpc.StreamInterceptor(a.countCalls))
	grpcsleep.Register(s)
	healthpb.RegisterHealthServer(s, a.health)
	return s
}

// countCalls keeps Sleep calls in inFlight and names the pod and the
// calls in flight in each one's header.
func (a *app) countCalls(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if !strings.HasPrefix(info.FullMethod, "/"+grpcsleep.Service+"/") {
		return handler(srv, ss) // the health service's Watch
	}
	n := a.inFlight.Add(1)
	defer a.inFlight.Add(-1)
	if err := ss.SetHeader(metadata.Pairs(PodMetadata, a.pod, InFlightMetadata, strconv.FormatInt(n, 10))); err != nil {
		return err
	}
	return handler(srv, ss)
}
