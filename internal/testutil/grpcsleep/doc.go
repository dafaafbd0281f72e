// Package grpcsleep is the Sleep gRPC service of the test servers (the
// real-kernel tests' pods and the autoscale test app): each call names
// how long to wait before its answer, so a client decides how long a
// stream stays in flight, as ?sleep= does over HTTP.
package grpcsleep
