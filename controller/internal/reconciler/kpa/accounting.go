package kpa

import (
	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
)

// A target is shown as counted per connection (status.accounting
// Connections) when, over its stable window, its pods' opaque
// concurrency (connections neither HTTP/1.x nor cleartext HTTP/2, each
// one request in flight for its whole life) is at least
// minOpaqueConcurrency and at least minOpaqueShare of their concurrency.
// Both must hold, so that one stray connection does not flip a target:
//   - a TLS target: all its load is opaque, 3 connections in flight of 3:
//     3 >= 0.1 and 100 % >= 10 %: Connections;
//   - a gRPC target at 40 streams in flight with one connection of
//     10 ms that was not HTTP/2 (a stray client) once in
//     the 60 s window: 0.0002 in flight, 0.0004 %: Requests;
//   - an idle target with one TLS health check open 2 s in 60: 0.03 in
//     flight, 100 % of its load but below the minimum: Requests;
//   - a busy HTTP/1 target at 200 in flight with one long-lived opaque
//     connection (a debugging tunnel): 1 in flight, 0.5 %: Requests.
const (
	minOpaqueConcurrency = 0.1
	minOpaqueShare       = 0.1
)

// accountingOf is a target's status.accounting after a tick whose stable
// window says a, last being the value shown before ("" for none). Without
// pod reports in the window it keeps last. A window with less than
// minOpaqueConcurrency in flight in all (idle) keeps last too, Requests
// when there is none: it says nothing of how the target's load is
// counted, and a TLS target that idles overnight would otherwise turn
// Requests and be announced as counted per connection again each morning.
func accountingOf(last v1alpha1.Accounting, a collector.Accounting) v1alpha1.Accounting {
	switch {
	case !a.HasData:
		return last
	case a.Opaque >= minOpaqueConcurrency && a.Opaque >= minOpaqueShare*a.Concurrency:
		return v1alpha1.AccountingConnections
	case a.Concurrency < minOpaqueConcurrency && last != "":
		return last
	}
	return v1alpha1.AccountingRequests
}
