//go:build linux

package bpf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// modelView is the state compared between the BPF programs and the model.
type modelView struct {
	InFlight, Started, Completed, Probes, OpaqueInFlight, OpaqueTotal int64
	RxNext, TxNext                                                    uint32
	Req                                                               int
	Opaque, Seen, Head                                                bool
	State, Hflags, Pos                                                uint8
	Status                                                            uint16
	Hash                                                              uint32
	Length, Remaining                                                 uint64
}

func (h *progHarness) view() modelView {
	s, c := h.stats(), h.conn()
	return modelView{
		InFlight: s.All.InFlight, Started: int64(s.All.Started), Completed: int64(s.All.Completed),
		Probes: int64(s.ProbesTotal), OpaqueInFlight: s.OpaqueInFlight, OpaqueTotal: int64(s.OpaqueTotal),
		RxNext: c.RxNext, TxNext: c.TxNext, Req: int(c.Req), Opaque: c.Opaque == 1, Seen: c.Seen == 1, Head: c.Head == 1,
		State: c.State, Hflags: c.Hflags, Pos: c.Pos, Status: c.Status, Hash: c.Hash, Length: c.Length, Remaining: c.Remaining,
	}
}

func viewOf(p *modelPod, c *modelConn) modelView {
	return modelView{
		InFlight: p.inFlight, Started: int64(p.started), Completed: int64(p.completed),
		Probes: int64(p.probes), OpaqueInFlight: p.opaqueInFlight, OpaqueTotal: int64(p.opaqueTotal),
		RxNext: c.rxNext, TxNext: c.txNext, Req: c.req, Opaque: c.opaque, Seen: c.seen, Head: c.head,
		State: c.state, Hflags: c.hflags, Pos: c.pos, Status: c.status, Hash: c.hash, Length: c.length, Remaining: c.remaining,
	}
}

// twin drives the BPF programs and the model with the same segments.
type twin struct {
	h     *progHarness
	pod   modelPod
	conn  *modelConn
	steps []string
}

const rx0, tx0 = 1000, 5000

func newTwin(t *testing.T) *twin {
	h := newProgHarness(t)
	return &twin{h: h, conn: newModelConn(rx0, tx0, false)}
}

func (w *twin) send(t *testing.T, ingress bool, seq uint32, payload []byte) {
	t.Helper()
	dir := "out"
	if ingress {
		dir = "in"
		w.h.ingress(seq, string(payload))
		w.conn.ingress(&w.pod, seq, payload)
	} else {
		w.h.egress(seq, string(payload))
		w.conn.egress(&w.pod, seq, payload)
	}
	w.steps = append(w.steps, fmt.Sprintf("%s seq=%d %q", dir, seq, truncate(payload)))
	if diff := cmp.Diff(viewOf(&w.pod, w.conn), w.h.view()); diff != "" {
		t.Fatalf("BPF differs from the model after:\n%s\n(-model +bpf):\n%s", strings.Join(w.steps, "\n"), diff)
	}
}

func truncate(b []byte) string {
	if len(b) > 120 {
		return string(b[:120]) + fmt.Sprintf("...(%d bytes)", len(b))
	}
	return string(b)
}

// exchange is one request and its response(s) as byte streams.
type exchange struct {
	request, response []byte
	probe, endsConn   bool
}

// randomExchange builds a well-formed HTTP/1.1 exchange of a random kind.
func randomExchange(rng *rand.Rand) exchange {
	var req bytes.Buffer
	method := []string{"GET", "POST", "HEAD", "DELETE", "OPTIONS"}[rng.IntN(5)]
	fmt.Fprintf(&req, "%s /path/%d HTTP/1.1\r\nHost: svc.ns.svc.cluster.local\r\n", method, rng.IntN(1000))
	ex := exchange{}
	// Agents in the shapes the parsers read in words and byte by byte.
	switch rng.IntN(8) {
	case 0:
		req.WriteString("User-Agent: kube-probe/1.36\r\n")
		ex.probe = true
	case 1:
		req.WriteString([]string{"user-agent:  sockscale-probe/activator\r\n", "USER-AGENT:kube-probe/1\r\n"}[rng.IntN(2)])
		ex.probe = true
	case 2:
		req.WriteString("User-Agent: Go-http-client/1.1\r\n")
	default:
		fmt.Fprintf(&req, "User-Agent: load/%d\r\n", rng.IntN(9))
	}
	for range rng.IntN(4) {
		fmt.Fprintf(&req, "X-Pad-%d: %s\r\n", rng.IntN(100), strings.Repeat("v", rng.IntN(200)))
	}
	var body []byte
	if method == "POST" {
		body = bytes.Repeat([]byte("b"), rng.IntN(3000))
		fmt.Fprintf(&req, "Content-Length: %d\r\n", len(body))
	}
	req.WriteString("\r\n")
	req.Write(body)
	ex.request = req.Bytes()

	var resp bytes.Buffer
	if method == "POST" && rng.IntN(4) == 0 {
		resp.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
	}
	size := rng.IntN(6000)
	switch kind := rng.IntN(10); {
	case method == "HEAD":
		fmt.Fprintf(&resp, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", size)
	case kind == 0:
		resp.WriteString("HTTP/1.1 204 No Content\r\nServer: x\r\n\r\n")
	case kind == 1:
		resp.WriteString("HTTP/1.1 304 Not Modified\r\nETag: \"a\"\r\n\r\n")
	case kind <= 4:
		resp.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n")
		resp.WriteString([]string{"transfer-encoding: gzip, Chunked\r\n", "Transfer-Encoding: chunked\r\nDate: Sun, 22 Nov 2026 23:02:42 GMT\r\n"}[rng.IntN(2)])
		resp.WriteString("\r\n")
		for left := size; left > 0; {
			n := min(left, 1+rng.IntN(2000))
			fmt.Fprintf(&resp, "%x", n)
			if rng.IntN(3) == 0 {
				resp.WriteString(";name=value")
			}
			resp.WriteString("\r\n")
			resp.Write(bytes.Repeat([]byte("c"), n))
			resp.WriteString("\r\n")
			left -= n
		}
		resp.WriteString("0\r\n")
		if rng.IntN(2) == 0 {
			resp.WriteString("Trailer-Field: 1\r\n")
		}
		resp.WriteString("\r\n")
	case kind == 5:
		fmt.Fprintf(&resp, "HTTP/1.0 200 OK\r\n\r\n%s", strings.Repeat("u", size))
		ex.endsConn = true // delimited by close
	default:
		fmt.Fprintf(&resp, "HTTP/1.1 200 OK\r\nCONTENT-LENGTH:  %d \r\nX: y\r\n\r\n%s", size, strings.Repeat("l", size))
	}
	ex.response = resp.Bytes()
	return ex
}

// sendStream sends b from sequence number start in random segments, with
// random retransmissions of what was already sent.
func (w *twin) sendStream(t *testing.T, rng *rand.Rand, ingress bool, start uint32, b []byte) {
	t.Helper()
	for _, s := range cutStream(rng, ingress, start, b) {
		w.send(t, s.ingress, s.seq, s.payload)
	}
}

func TestProgMatchesModelOnRandomExchanges(t *testing.T) {
	for seed := range uint64(60) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			w := newTwin(t)
			rx, tx := uint32(rx0), uint32(tx0)
			wantStarted, wantProbes := 0, 0
			for range 1 + rng.IntN(5) {
				ex := randomExchange(rng)
				w.sendStream(t, rng, true, rx, ex.request)
				rx += uint32(len(ex.request))
				w.sendStream(t, rng, false, tx, ex.response)
				tx += uint32(len(ex.response))
				// A probe on a connection that already carried load is load.
				if ex.probe && wantStarted == 0 {
					wantProbes++
				} else {
					wantStarted++
				}
				if ex.endsConn {
					break
				}
			}
			// Beyond agreeing with the model, the counts must be right.
			got := w.h.view()
			if int(got.Started) != wantStarted || int(got.Probes) != wantProbes || got.OpaqueTotal != 0 {
				t.Fatalf("started=%d probes=%d opaque=%d, want started=%d probes=%d opaque=0\n%s",
					got.Started, got.Probes, got.OpaqueTotal, wantStarted, wantProbes, strings.Join(w.steps, "\n"))
			}
		})
	}
}

// FuzzProgMatchesModel feeds arbitrary segment streams (see fuzzSegments)
// to the BPF programs and to the model.
func FuzzProgMatchesModel(f *testing.F) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 8 {
		ex := randomExchange(rng)
		var rec []byte
		for _, part := range []struct {
			in bool
			b  []byte
		}{{true, ex.request}, {false, ex.response}} {
			for off := 0; off < len(part.b); off += 1000 {
				chunk := part.b[off:min(len(part.b), off+1000)]
				flags := byte(0)
				if part.in {
					flags = 1
				}
				rec = append(rec, flags)
				rec = binary.BigEndian.AppendUint16(rec, uint16(len(chunk)))
				rec = append(rec, chunk...)
			}
		}
		f.Add(rec)
	}
	f.Add([]byte("\x01\x00\x05GET /\x00\x00\x04HTTP"))
	shared := newProgHarness(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		shared.t = t
		shared.reset()
		w := &twin{h: shared, conn: newModelConn(rx0, tx0, false)}
		for _, s := range fuzzSegments(data) {
			w.send(t, s.ingress, s.seq, s.payload)
		}
	})
}
