//go:build linux

package bpf

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"
)

// TCP flags of crafted packets that end connections.
const (
	tcpFIN = 0x01
	tcpRST = 0x04
)

// TestProgAdoption runs connections that were open before the programs
// were loaded (an agent upgrade): no state when their segments come. The
// test object stands for TCP's established sockets with test_sockets
// (lib/adopt.h). A pod's server connection is adopted at its next client
// segment: a connection from then on, requests from the next whole
// request line, responses from the next status line; it ends at the
// server's FIN or either side's RST, which sock_ops may never report for
// it. A pod's own client connection is never adopted.
func TestProgAdoption(t *testing.T) {
	const ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	body := "tail of a body the previous build saw start"
	f := newH2Frames()
	h2First := h2ClientPreface + f.settings().request(1).data(1, 5, true).take()
	h2Answer := f.settings().response(1, 9).take()
	h2Next := f.request(3).data(3, 5, true).take()
	type segment struct {
		in    bool
		off   uint32 // relative to 1000 (client) or 5000 (server)
		flags byte   // 0: PSH|ACK
		data  string
		// accept: sock_ops sees the connection established now (client
		// and server at off, 0), after ingress adopted it
		accept bool
	}
	in := func(off uint32, data string) segment { return segment{in: true, off: off, data: data} }
	out := func(off uint32, data string) segment { return segment{off: off, data: data} }
	type want struct {
		Counts            counts
		Conns, ConnsTotal int64
		Adopted           uint64
	}
	tests := []struct {
		name   string
		client bool // the pod's own client connection, not its server's
		segs   []segment
		want   want
	}{{
		name: "a request line is adopted and counts",
		segs: []segment{in(0, get), out(0, ok)},
		want: want{Counts: counts{Started: 1, Completed: 1}, Conns: 1, ConnsTotal: 1, Adopted: 1},
	}, {
		name: "adopted in a body: requests from the next request line",
		segs: []segment{
			in(0, body), out(0, ok), // the request the previous build counted
			in(uint32(len(body)), get), out(uint32(len(ok)), ok),
			in(uint32(len(body)+len(get)), get),
		},
		want: want{Counts: counts{InFlight: 1, Started: 2, Completed: 1}, Conns: 1, ConnsTotal: 1, Adopted: 1},
	}, {
		name: "a response under way before the adoption is skipped",
		segs: []segment{out(0, "ody of a response"), in(0, get), out(17, ok)},
		want: want{Counts: counts{Started: 1, Completed: 1}, Conns: 1, ConnsTotal: 1, Adopted: 1},
	}, {
		name: "the server's FIN ends it",
		segs: []segment{in(0, get), {off: 0, flags: tcpFIN | tcpACK}},
		want: want{Counts: counts{Started: 1, Completed: 1}, ConnsTotal: 1, Adopted: 1},
	}, {
		name: "the server's last response with its FIN",
		segs: []segment{in(0, get), {off: 0, flags: tcpFIN | tcpPSH | tcpACK, data: ok}},
		want: want{Counts: counts{Started: 1, Completed: 1}, ConnsTotal: 1, Adopted: 1},
	}, {
		name: "the client's FIN only half-closes",
		segs: []segment{in(0, get), {in: true, off: uint32(len(get)), flags: tcpFIN | tcpACK}},
		want: want{Counts: counts{InFlight: 1, Started: 1}, Conns: 1, ConnsTotal: 1, Adopted: 1},
	}, {
		name: "the client's RST ends it",
		segs: []segment{in(0, get), {in: true, off: uint32(len(get)), flags: tcpRST}},
		want: want{Counts: counts{Started: 1, Completed: 1}, ConnsTotal: 1, Adopted: 1},
	}, {
		name: "adopted in the instant before sock_ops' callback: counted once",
		segs: []segment{in(0, get), {accept: true, off: uint32(len(get))}, out(0, ok)},
		want: want{Counts: counts{Started: 1, Completed: 1}, Conns: 1, ConnsTotal: 1, Adopted: 1},
	}, {
		// A new pod's connection accepted before its pod was known (its
		// first probes): its first bytes are the HTTP/2 preface.
		name: "adopted at its HTTP/2 preface: each stream a request",
		segs: []segment{in(0, h2First), out(0, h2Answer), in(uint32(len(h2First)), h2Next)},
		want: want{Counts: counts{InFlight: 1, Started: 2, Completed: 1}, Conns: 1, ConnsTotal: 1, Adopted: 1},
	}, {
		name: "adopted at its HTTP/2 preface: the server's FIN ends its streams",
		segs: []segment{in(0, h2First), {off: 0, flags: tcpFIN | tcpACK}},
		want: want{Counts: counts{Started: 1, Completed: 1}, ConnsTotal: 1, Adopted: 1},
	}, {
		name:   "the pod's own client connection is not adopted",
		client: true,
		segs:   []segment{in(0, ok), in(uint32(len(ok)), get), out(0, get)},
		want:   want{},
	}}
	for _, fam := range families(t) {
		t.Run(fam.name, func(t *testing.T) {
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					h := fam.harness(t)
					h.disconnect() // open before the programs: no state
					server := uint8(1)
					if tc.client {
						server = 0
					}
					if err := h.objs.TestSockets.Update(&h.key, server, ebpf.UpdateAny); err != nil {
						t.Fatal(err)
					}
					for _, s := range tc.segs {
						flags := s.flags
						if flags == 0 {
							flags = tcpPSH | tcpACK
						}
						switch {
						case s.accept:
							h.accept(1000+s.off, 5000)
						case s.in:
							pkt := packetFlags(h.peer, h.pod, testPeerPort, testPodPort, 1000+s.off, flags, []byte(s.data))
							setAck(pkt, 5000) // the client has every server byte
							h.run(h.objs.SockscaleIngress, pkt)
						default:
							h.run(h.objs.SockscaleEgress, packetFlags(h.pod, h.peer, testPodPort, testPeerPort, 5000+s.off, flags, []byte(s.data)))
						}
					}
					st := h.stats()
					got := want{Counts: h.counts(), Conns: st.ConnsInFlight, ConnsTotal: int64(st.ConnsTotal), Adopted: h.events()[evAdopted]}
					if diff := cmp.Diff(tc.want, got); diff != "" {
						t.Errorf("(-want +got):\n%s", diff)
					}
					if tc.client {
						// Decided once: state that counts nothing, so later
						// segments cost a lookup and no more.
						if c := h.conn(); c.Closed != 1 || c.Adopted != 0 {
							t.Errorf("the pod's client connection: closed=%d adopted=%d, want 1 and 0", c.Closed, c.Adopted)
						}
					}
				})
			}
		})
	}
}
