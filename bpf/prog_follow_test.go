//go:build linux

package bpf

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// step is one step of a scripted connection: a segment, or the accept that
// sock_ops sees (for data that reached the listening socket first).
type step struct {
	seg
	listen, syn, accept bool
}

func sIn(off uint32, data string) step  { return step{seg: in(off, data)} }
func sOut(off uint32, data string) step { return step{seg: out(off, data)} }

// sListen sends client bytes before the connection is accepted; syn marks
// a SYN carrying them (TCP Fast Open: off is then the SYN's, one before the
// first byte).
func sListen(off uint32, data string, syn bool) step {
	return step{seg: in(off, data), listen: true, syn: syn}
}

// sAccept establishes the connection (client and server at rx0, tx0).
func sAccept() step { return step{accept: true} }

// runSteps plays steps on h; a script that starts before the accept starts
// without a connection.
func runSteps(t *testing.T, h *progHarness, steps []step) {
	t.Helper()
	if len(steps) > 0 && (steps[0].listen || steps[0].accept) {
		h.disconnect()
	}
	for _, s := range steps {
		switch {
		case s.accept:
			h.accept(rx0, tx0)
		case s.listen:
			h.listen(rx0+s.off, s.data, s.syn)
		case s.in:
			h.ingress(rx0+s.off, s.data)
		default:
			h.egress(tx0+s.off, s.data)
		}
	}
}

// Messages of the scripts below.
const (
	ok5        = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello"
	post10     = "POST /u HTTP/1.1\r\nHost: hello\r\nContent-Length: 10\r\n\r\n0123456789"
	expect10   = "POST /u HTTP/1.1\r\nHost: hello\r\nExpect: 100-continue\r\nContent-Length: 10\r\n\r\n"
	early413   = "HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\nConnection: keep-alive\r\n\r\n"
	early401   = "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic\r\nContent-Length: 4\r\n\r\nauth"
	head1000   = "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
	headReq    = "HEAD /x HTTP/1.1\r\nHost: hello\r\n\r\n"
	chunkedReq = "POST /c HTTP/1.1\r\nHost: hello\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n1a;x=y\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nTrailer: 1\r\n\r\n"
)

// keepAlive is n more get requests and ok5 responses after rx and tx bytes
// of the connection.
func keepAlive(rx, tx uint32, n int) []step {
	var steps []step
	for range n {
		steps = append(steps, sIn(rx, get), sOut(tx, ok5))
		rx += uint32(len(get))
		tx += uint32(len(ok5))
	}
	return steps
}

func cat(parts ...[]step) []step {
	var all []step
	for _, p := range parts {
		all = append(all, p...)
	}
	return all
}

// TestProgFollowsEveryRequest: valid HTTP/1.x is followed request by
// request where segments come reordered, arrive before the accept, carry
// stray CRLFs, pipelined requests or the rest of a body after an early
// response; where the parser does lose the stream it finds it again.
func TestProgFollowsEveryRequest(t *testing.T) {
	lg, lp, l10, le := uint32(len(get)), uint32(len(post10)), uint32(len(ok5)), uint32(len(expect10))
	pipelined := get + headReq + get
	var deep strings.Builder
	for range maxPipeline + 1 {
		deep.WriteString(get)
	}
	tests := []struct {
		name  string
		steps []step
		want  counts
	}{
		// Pipelining.
		{"pipelined requests count one per request",
			[]step{sIn(0, get+get+get)}, counts{InFlight: 3, Started: 3}},
		{"pipelined requests complete one per response",
			[]step{sIn(0, get+get+get), sOut(0, ok5+ok5)}, counts{InFlight: 1, Started: 3, Completed: 2}},
		{"pipelined requests split anywhere",
			[]step{sIn(0, pipelined[:60]), sIn(60, pipelined[60:100]), sIn(100, pipelined[100:]),
				sOut(0, ok5+head1000+ok5)},
			counts{Started: 3, Completed: 3}},
		{"pipelined HEAD: its response has no body, the next one has",
			[]step{sIn(0, get+headReq+get), sOut(0, ok5+head1000), sOut(l10+uint32(len(head1000)), ok5)},
			counts{Started: 3, Completed: 3}},
		{"more pipelined requests than are followed one by one: the rest wait for a resynchronisation",
			cat([]step{sIn(0, deep.String()), sOut(0, strings.Repeat(ok5, maxPipeline+1))},
				keepAlive(uint32(deep.Len()), uint32(maxPipeline+1)*l10, 1)),
			counts{Started: maxPipeline + 1, Completed: maxPipeline + 1}},
		{"request bodies of both framings, pipelined",
			[]step{sIn(0, post10+chunkedReq+get), sOut(0, ok5+ok5+ok5)},
			counts{Started: 3, Completed: 3}},
		// Stray CRLF (RFC 9112 section 2.2).
		{"a stray CRLF before a keep-alive request",
			cat([]step{sIn(0, post10), sOut(0, ok5), sIn(lp, "\r\n"+get), sOut(l10, ok5)}, keepAlive(lp+2+lg, 2*l10, 2)),
			counts{Started: 4, Completed: 4}},
		{"a stray CRLF in a segment of its own",
			cat([]step{sIn(0, get), sOut(0, ok5), sIn(lg, "\r\n"), sIn(lg+2, "\n"+get), sOut(l10, ok5)}, keepAlive(2*lg+3, 2*l10, 2)),
			counts{Started: 4, Completed: 4}},
		// Early final responses (Expect: 100-continue).
		{"an early 413, then the rest of the body, then keep-alive requests",
			cat([]step{sIn(0, expect10), sOut(0, early413), sIn(le, "0123456789")}, keepAlive(le+10, uint32(len(early413)), 3)),
			counts{Started: 4, Completed: 4}},
		{"an early 401, then the body and the next request in one segment",
			[]step{sIn(0, expect10), sOut(0, early401), sIn(le, "0123456789"+get), sOut(uint32(len(early401)), ok5)},
			counts{Started: 2, Completed: 2}},
		{"100 Continue, then the body, then the final response",
			cat([]step{sIn(0, expect10), sOut(0, "HTTP/1.1 100 Continue\r\n\r\n"), sIn(le, "0123"), sIn(le+4, "456789"),
				sOut(25, ok5)}, keepAlive(le+10, 25+l10, 1)),
			counts{Started: 2, Completed: 2}},
		// Reordered and lost segments (ingress runs before TCP puts them in order).
		{"the first segment of a request arrives after the second",
			cat([]step{sIn(20, get[20:]), sIn(0, get[:20]), sOut(0, ok5)}, keepAlive(lg, l10, 3)),
			counts{Started: 4, Completed: 4}},
		{"a reordered segment inside a body is skipped by count",
			cat([]step{sIn(60, post10[60:]), sIn(0, post10[:60]), sOut(0, ok5)}, keepAlive(lp, l10, 2)),
			counts{Started: 3, Completed: 3}},
		{"two holes filled in reverse order",
			cat([]step{sIn(40, get[40:]), sIn(20, get[20:40]), sIn(0, get[:20]), sOut(0, ok5)}, keepAlive(lg, l10, 2)),
			counts{Started: 3, Completed: 3}},
		// Request bytes that reach the listening socket (before the accept).
		{"request on the segment that completes the handshake (TCP_DEFER_ACCEPT, a lost ACK)",
			cat([]step{sListen(0, get, false), sAccept(), sOut(0, ok5)}, keepAlive(lg, l10, 3)),
			counts{Started: 4, Completed: 4}},
		{"request on a SYN (TCP Fast Open)",
			cat([]step{sListen(^uint32(0), get, true), sAccept(), sOut(0, ok5)}, keepAlive(lg, l10, 3)),
			counts{Started: 4, Completed: 4}},
		{"a probe on the segment that completes the handshake is no load",
			[]step{sListen(0, "GET /healthz HTTP/1.1\r\nUser-Agent: kube-probe/1.36\r\n\r\n", false), sAccept(), sOut(0, ok5)},
			counts{Probes: 1}},
		{"TLS on the segment that completes the handshake is opaque",
			[]step{sListen(0, "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", false), sAccept()},
			counts{InFlight: 1, Started: 1, OpaqueInFlight: 1, OpaqueTotal: 1}},
		{"the second segment of a request before the accept, the first after it",
			cat([]step{sListen(20, get[20:], false), sAccept(), sIn(0, get[:20]), sOut(0, ok5)}, keepAlive(lg, l10, 2)),
			counts{Started: 3, Completed: 3}},
		// Losing the stream and finding it again.
		{"bytes that are no request after a response: resynchronised at the next request line",
			cat([]step{sIn(0, get), sOut(0, ok5), sIn(lg, "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")}, keepAlive(lg+11, l10, 2)),
			counts{Started: 3, Completed: 3}},
		{"a malformed response after a good one: resynchronised at the next response",
			cat([]step{sIn(0, get), sOut(0, ok5), sIn(lg, get), sOut(l10, "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\nxx")},
				keepAlive(2*lg, 2*l10+40, 2)),
			counts{Started: 4, Completed: 4}},
		{"a request is in flight while the response is lost",
			[]step{sIn(0, get), sOut(0, ok5), sIn(lg, get), sOut(l10, "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\nxx")},
			counts{InFlight: 1, Started: 2, Completed: 1}},
		{"opaque is decided at the start: TLS first",
			[]step{sIn(0, "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"), sOut(0, "\x16\x03\x03\x00\x7a"), sIn(11, get)},
			counts{InFlight: 1, Started: 1, OpaqueInFlight: 1, OpaqueTotal: 1}},
	}
	for _, fam := range families(t) {
		t.Run(fam.name, func(t *testing.T) {
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					h := fam.harness(t)
					runSteps(t, h, tt.steps)
					if diff := cmp.Diff(tt.want, h.counts()); diff != "" {
						var script []string
						for _, s := range tt.steps {
							script = append(script, fmt.Sprintf("%+v", s))
						}
						t.Errorf("counts (-want +got):\n%s\nsteps:\n%s", diff, strings.Join(script, "\n"))
					}
				})
			}
		})
	}
}

// TestProgProbesOnlyFromProbers: a probe's User-Agent makes a request no
// load only when its client may send health probes: the node (the
// kubelet) or an activator (its prober). From any other client it is
// load, whether its bytes came before the accept (the stash classified
// them) or after: a client that sent it to hide its load could otherwise
// take a busy target to zero.
func TestProgProbesOnlyFromProbers(t *testing.T) {
	probe := "GET /healthz HTTP/1.1\r\nUser-Agent: kube-probe/1.36\r\n\r\n"
	lp, l10 := uint32(len(probe)), uint32(len(ok5))
	scripts := []struct {
		name  string
		steps []step
	}{
		{"after the accept", []step{sAccept(), sIn(0, probe), sOut(0, ok5), sIn(lp, probe), sOut(l10, ok5)}},
		{"before the accept", []step{sListen(0, probe, false), sAccept(), sOut(0, ok5), sIn(lp, probe), sOut(l10, ok5)}},
		// Its User-Agent before the accept, the end of its headers after.
		{"split around the accept", []step{sListen(0, probe[:lp-2], false), sAccept(), sIn(lp-2, probe[lp-2:]), sOut(0, ok5)}},
	}
	fams := families(t)
	for _, sc := range scripts {
		n := int64(1)
		if len(sc.steps) > 4 {
			n = 2
		}
		for _, tt := range []struct {
			peer peerKind
			want counts
		}{
			{peerNode, counts{Probes: n}},
			{peerActivator, counts{Probes: n}},
			{peerAnyIsNode, counts{Probes: n}},
			{peerOther, counts{Started: n, Completed: n}},
		} {
			for _, fam := range fams {
				t.Run(fmt.Sprintf("%s/peer %d/%s", sc.name, tt.peer, fam.name), func(t *testing.T) {
					h := fam.harness(t)
					h.setPeerKind(tt.peer)
					runSteps(t, h, sc.steps)
					if diff := cmp.Diff(tt.want, h.counts()); diff != "" {
						t.Errorf("counts (-want +got):\n%s", diff)
					}
				})
			}
		}
	}
}
