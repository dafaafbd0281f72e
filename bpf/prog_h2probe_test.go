package bpf

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/net/http2"
)

// grpcProbe writes a gRPC health check's HEADERS as grpc-go writes the
// kubelet's (the fields in its order), with user agent ua.
func (f *h2Frames) grpcProbe(stream uint32, ua string) *h2Frames {
	return f.headers(stream, false, ":method", "POST", ":scheme", "http", ":path", "/grpc.health.v1.Health/Check",
		":authority", "10.0.0.1:9090", "content-type", "application/grpc", "user-agent", ua, "te", "trailers",
		"grpc-timeout", "998683u")
}

// rawHeaders writes a HEADERS frame of a header block given as bytes.
func (f *h2Frames) rawHeaders(stream uint32, block string, p http2.HeadersFrameParam) *h2Frames {
	p.StreamID, p.BlockFragment, p.EndHeaders = stream, []byte(block), true
	_ = f.fr.WriteHeaders(p)
	return f
}

const kubeletUA = "kube-probe/1.36 grpc-go/1.79.3"

// TestProgHTTP2Probes: on a connection whose client may probe (the node,
// an activator), a stream whose HEADERS carry a health prober's
// User-Agent is a probe, not load, however HPACK wrote the field; until
// a stream of the connection is load, as for HTTP/1.
func TestProgHTTP2Probes(t *testing.T) {
	type step = h2Step
	cli, srv, preface := cliStep, srvStep, prefaceStep
	raw := func(s string) step { return step{true, func(*h2Exchange) string { return s }} }
	// A header block by hand: :method GET (indexed), then the user agent.
	const get = "\x82"
	tests := []struct {
		name     string
		loadOnly bool // the client is neither the node nor an activator
		steps    []step
		want     counts
	}{
		{"the kubelet's gRPC probe", false, []step{preface,
			cli(func(c *h2Frames) { c.grpcProbe(1, kubeletUA).data(1, 5, true) }),
			srv(func(s *h2Frames) { s.response(1, 7) })},
			counts{Probes: 1}},
		{"an activator's h2c probe", false, []step{preface,
			cli(func(c *h2Frames) {
				c.headers(1, true, ":method", "GET", ":scheme", "http", ":path", "/", ":authority", "10.0.0.1:8080", "user-agent", "sockscale-probe/readiness")
			}),
			srv(func(s *h2Frames) { s.response(1, 7) })},
			counts{Probes: 1}},
		{"a raw literal with incremental indexing", false, []step{preface,
			cli(func(c *h2Frames) { c.rawHeaders(1, get+"\x7a\x0fkube-probe/1.36", http2.HeadersFrameParam{}) })},
			counts{Probes: 1}},
		{"a literal without indexing", false, []step{preface,
			cli(func(c *h2Frames) { c.rawHeaders(1, get+"\x0f\x2b\x10sockscale-probe/", http2.HeadersFrameParam{}) })},
			counts{Probes: 1}},
		{"a never-indexed literal after a table size update", false, []step{preface,
			cli(func(c *h2Frames) {
				c.rawHeaders(1, "\x3f\xe1\x1f"+get+"\x1f\x2b\x0bkube-probe/", http2.HeadersFrameParam{})
			})},
			counts{Probes: 1}},
		{"padding and priority before the block", false, []step{preface,
			cli(func(c *h2Frames) {
				c.rawHeaders(1, get+"\x7a\x0fkube-probe/1.36", http2.HeadersFrameParam{PadLength: 7, Priority: http2.PriorityParam{StreamDep: 0, Weight: 15}})
			})},
			counts{Probes: 1}},
		{"an agent that is not a prober's", false, []step{preface,
			cli(func(c *h2Frames) { c.grpcProbe(1, "grpc-go/1.79.3") })},
			counts{InFlight: 1, Started: 1}},
		{"a user-agent name written as a literal is not looked for", false, []step{preface,
			cli(func(c *h2Frames) { c.rawHeaders(1, get+"\x40\x0auser-agent\x0bkube-probe/", http2.HeadersFrameParam{}) })},
			counts{InFlight: 1, Started: 1}},
		{"a prober's agent from a client that may not probe is load", true, []step{preface,
			cli(func(c *h2Frames) { c.grpcProbe(1, kubeletUA) })},
			counts{InFlight: 1, Started: 1}},
		{"after a stream that is load, a probe's agent is load too", false, []step{preface,
			cli(func(c *h2Frames) { c.request(1) }),
			cli(func(c *h2Frames) { c.grpcProbe(3, kubeletUA) })},
			counts{InFlight: 2, Started: 2}},
		{"a second probe on the connection names its agent from the dynamic table: load", false, []step{preface,
			cli(func(c *h2Frames) { c.grpcProbe(1, kubeletUA).data(1, 5, true) }),
			srv(func(s *h2Frames) { s.response(1, 7) }),
			cli(func(c *h2Frames) { c.grpcProbe(3, kubeletUA).data(3, 5, true) })},
			counts{InFlight: 1, Started: 1, Probes: 1}},
		{"two new streams in one segment: the first is looked at, the second is load", false, []step{preface,
			cli(func(c *h2Frames) { c.grpcProbe(1, kubeletUA).request(3) })},
			counts{InFlight: 1, Started: 1, Probes: 1}},
		{"a user agent the segment cuts short of its prefix: load", false, []step{preface,
			raw("\x00\x00\x0f\x01\x04\x00\x00\x00\x01" + get + "\x7a\x0fkube-pr"),
			raw("obe/1.36")},
			counts{InFlight: 1, Started: 1}},
	}
	for _, fam := range families(t) {
		t.Run(fam.name, func(t *testing.T) {
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					h := fam.harness(t)
					h.connect(1000, 5000, false)
					if tt.loadOnly {
						h.loadOnly()
					}
					newH2Exchange(h).play(tt.steps)
					if diff := cmp.Diff(tt.want, h.counts()); diff != "" {
						t.Errorf("counts (-want +got):\n%s", diff)
					}
				})
			}
		})
	}
}

// loadOnly makes the harness's connection one whose client may not probe
// (lib/accept.h's load_only).
func (h *progHarness) loadOnly() {
	h.t.Helper()
	var c accountingConn
	if err := h.objs.Conns.Lookup(&h.key, &c); err != nil {
		h.t.Fatalf("look up conn: %v", err)
	}
	c.Load = 1
	if err := h.objs.Conns.Update(&h.key, &c, ebpf.UpdateExist); err != nil {
		h.t.Fatalf("update conn: %v", err)
	}
}
