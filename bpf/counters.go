package bpf

import (
	"net/netip"
	"time"
)

// RequestCounters describe the requests of one kind (all, or only those that
// came through an activator) that one pod has served since it was added to
// the pod map.
type RequestCounters struct {
	// InFlight is the number of requests started and not yet completed.
	InFlight int64
	// Started and Completed count requests since the pod was added.
	Started, Completed uint64
	// Area is the time integral of InFlight since the pod was added: one
	// request in flight for one second adds one second. The average
	// concurrency over a period is the growth of Area divided by the period.
	Area time.Duration
}

// Add returns the sum of two sets of request counters.
func (c RequestCounters) Add(o RequestCounters) RequestCounters {
	return RequestCounters{InFlight: c.InFlight + o.InFlight, Started: c.Started + o.Started,
		Completed: c.Completed + o.Completed, Area: c.Area + o.Area}
}

// PodCounters is one pod's accounting at one instant.
type PodCounters struct {
	// Requests counts every request the pod served, proxied ones included.
	Requests RequestCounters
	// Proxied counts the subset of Requests whose client was an activator.
	Proxied RequestCounters
	// ConnsInFlight is the number of open server-side connections.
	ConnsInFlight int64
	// ConnsTotal counts connections accepted since the pod was added.
	ConnsTotal uint64
	// OpaqueConnsInFlight and OpaqueConnsTotal count the connections whose
	// bytes are neither HTTP/1.x nor HTTP/2 with prior knowledge (TLS,
	// other protocols), or whose HTTP/2 frames could not be followed. Each
	// such connection is accounted as one request for its whole life.
	OpaqueConnsInFlight int64
	OpaqueConnsTotal    uint64
	// H2ConnsInFlight and H2ConnsTotal count the connections followed as
	// HTTP/2 with prior knowledge (h2c, gRPC): each of their streams is a
	// request.
	H2ConnsInFlight int64
	H2ConnsTotal    uint64
	// ProbesTotal counts requests that were recognised as health probes
	// (kubelet, sockscale) and therefore not counted as load.
	ProbesTotal uint64
}

// Add returns the counters of two addresses of one pod together: every
// count and area is a sum (a request or connection is on one address).
func (c PodCounters) Add(o PodCounters) PodCounters {
	return PodCounters{
		Requests: c.Requests.Add(o.Requests), Proxied: c.Proxied.Add(o.Proxied),
		ConnsInFlight: c.ConnsInFlight + o.ConnsInFlight, ConnsTotal: c.ConnsTotal + o.ConnsTotal,
		OpaqueConnsInFlight: c.OpaqueConnsInFlight + o.OpaqueConnsInFlight, OpaqueConnsTotal: c.OpaqueConnsTotal + o.OpaqueConnsTotal,
		H2ConnsInFlight: c.H2ConnsInFlight + o.H2ConnsInFlight, H2ConnsTotal: c.H2ConnsTotal + o.H2ConnsTotal,
		ProbesTotal: c.ProbesTotal + o.ProbesTotal,
	}
}

// Snapshot is every tracked pod's counters, read at one kernel time.
type Snapshot struct {
	// At is the CLOCK_MONOTONIC time the areas were evaluated at.
	At time.Duration
	// Pods maps each accounted address to its counters: a dual-stack
	// pod's two addresses each have their own (see PodCounters.Add).
	Pods map[netip.Addr]PodCounters
}

// Events count what the kernel side could not account exactly.
type Events struct {
	// ConnUntracked counts connections not tracked because the kernel had
	// no memory for their state: socket storage counts against the
	// socket's option memory (net.core.optmem_max) and the agent's memory
	// cgroup.
	ConnUntracked uint64
	// ParseLimit counts segments that needed more parse steps than a BPF
	// program may take, and requests pipelined deeper than MaxPipeline:
	// the parser lost the stream there, and resynchronises (Resync).
	ParseLimit uint64
	// ParseError counts requests and responses that were not valid
	// HTTP/1.x: a first response makes its connection opaque (accounted at
	// connection level, OpaqueConnsTotal); later, the parser loses the
	// stream and resynchronises. Bytes that are not HTTP/1.x from a
	// connection's start (TLS, h2) are opaque, not parse errors.
	ParseError uint64
	// StreamGap counts client bytes the parser never saw, that were not
	// body bytes it could skip by count: segments reordered past a hole
	// that TCP filled later, or bytes sent before the accept whose state
	// was evicted. The parser lost the stream there, and resynchronises.
	StreamGap uint64
	// Resync counts the times a parser that lost the stream found it
	// again: a request line at the start of a segment once no request was
	// in flight, or a status line once the client spoke after the server.
	Resync uint64
	// Adopted counts connections that were open before the programs were
	// loaded (an agent upgrade, or accepted before their pod was added),
	// taken up at their next client bytes: counted as connections from
	// then on, their requests from the next whole request line.
	Adopted uint64
	// H2Full counts HTTP/2 streams not counted because MaxH2Streams were
	// in flight on their connection already.
	H2Full uint64
	// H2Lost counts HTTP/2 connections whose frames could not be followed
	// (a framing error, too many frames in one segment, bytes never seen):
	// accounted at connection level from then on.
	H2Lost uint64
	// RxWait counts client segments that waited for another CPU walking
	// the same connection's bytes: the kernel can receive two segments of
	// one connection at once (before TCP takes the socket's lock), and
	// they are walked one after the other. Not a loss.
	RxWait uint64
	// RxTakeover counts client segments that waited far longer than any
	// walk takes for another CPU's and walked all the same: a claim that
	// nobody gives back (a state copied while it was walked). Never seen on
	// a working kernel.
	RxTakeover uint64
}

// Limits of the kernel maps and parsers (accounting.h).
const (
	MaxPods       = 4096
	MaxActivators = 1024
	// MaxNodeAddrs is how many addresses of the node itself the programs
	// know (SetNodeAddrs).
	MaxNodeAddrs = 256
	// MaxLearned is how many connections the agent may count that the
	// programs have not seen yet (Audit).
	MaxLearned = 65536
	// MaxPipeline is how many requests in flight on one connection are
	// counted one by one; a client that pipelines deeper loses the
	// parser the stream until no request is in flight.
	MaxPipeline = 16
	// MaxH2Streams is how many HTTP/2 streams in flight on one connection
	// are counted one by one; a stream opened beyond them is not counted
	// (Events.H2Full).
	MaxH2Streams = 128
)
