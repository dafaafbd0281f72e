//go:build linux

package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"
)

// msgView is one direction's parser state as compared.
type msgView struct {
	State, Hflags, Pos uint8
	Status             uint16
	Hash               uint32
	Length, Remaining  uint64
}

// modelView is the state compared between the BPF programs and the model.
type modelView struct {
	InFlight, Started, Completed, Probes, OpaqueInFlight, OpaqueTotal int64
	Events                                                            [evMax]uint64
	RxNext, TxNext, Pushed, Popped                                    uint32
	HeadBits, ProbeBits                                               uint16
	Seen, Load, Answered, Opaque, Tunnel, RxGap                       bool
	GapSeq, GapEnd                                                    uint32
	Rx, Tx                                                            msgView
	H2                                                                uint8
	H2InFlight, H2Total                                               int64
	H2Rx, H2Tx                                                        h2DirView
	H2MaxStream                                                       uint32
	H2Ids                                                             [maxH2Streams]uint32
}

// h2DirView is one direction's HTTP/2 framing as compared.
type h2DirView struct {
	Left, Frames uint32
	Have         uint8
	Hdr          [h2HeaderLen]byte
}

func msgViewOf(m accountingMsg) msgView {
	return msgView{State: m.State, Hflags: m.Hflags, Pos: m.Pos, Status: m.Status, Hash: m.Hash, Length: m.Length, Remaining: m.Remaining}
}

func modelMsgView(m modelMsg) msgView {
	return msgView{State: m.state, Hflags: m.hflags, Pos: m.pos, Status: m.status, Hash: m.hash, Length: m.length, Remaining: m.remaining}
}

// connView is the view of c, the state of the harness's connection or of
// its stash entry.
func (h *progHarness) connView(c accountingConn) modelView {
	s := h.stats()
	return modelView{
		InFlight: s.All.InFlight, Started: int64(s.All.Started), Completed: int64(s.All.Completed),
		Probes: int64(s.ProbesTotal), OpaqueInFlight: s.OpaqueInFlight, OpaqueTotal: int64(s.OpaqueTotal),
		H2InFlight: s.H2InFlight, H2Total: int64(s.H2Total),
		Events: h.events(),
		RxNext: c.RxNext, TxNext: c.TxNext, Pushed: c.Pushed, Popped: c.Popped, HeadBits: c.HeadBits, ProbeBits: c.ProbeBits,
		H2:   c.H2,
		Seen: c.Seen == 1, Load: c.Load == 1, Answered: c.Answered == 1, Opaque: c.Opaque == 1, Tunnel: c.Tunnel == 1, RxGap: c.RxGap == 1,
		GapSeq: c.GapSeq, GapEnd: c.GapEnd, Rx: msgViewOf(c.Rx), Tx: msgViewOf(c.Tx),
	}
}

func (h *progHarness) view() modelView {
	h.t.Helper()
	return h.withH2(h.connView(h.conn()), h.objs.H2Conns)
}

// withH2 adds to v the connection's HTTP/2 state in m, if it has one.
func (h *progHarness) withH2(v modelView, m *ebpf.Map) modelView {
	h.t.Helper()
	var h2 accountingH2Conn
	if err := m.Lookup(&h.key, &h2); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		h.t.Fatalf("read HTTP/2 state: %v", err)
	}
	v.H2Rx = h2DirView{Left: h2.Rx.Left, Frames: h2.Rx.Frames, Have: h2.Rx.Have, Hdr: [h2HeaderLen]byte(h2.Rx.Hdr[:h2HeaderLen])}
	v.H2Tx = h2DirView{Left: h2.Tx.Left, Frames: h2.Tx.Frames, Have: h2.Tx.Have, Hdr: [h2HeaderLen]byte(h2.Tx.Hdr[:h2HeaderLen])}
	v.H2MaxStream, v.H2Ids = h2.MaxStream, h2.Ids
	return v
}

// stashView is the view of the connection's stash entry (before the
// accept), with the HTTP/2 state walked into h2_stash.
func (h *progHarness) stashView() modelView {
	h.t.Helper()
	var c accountingConn
	if err := h.objs.Stash.Lookup(&h.key, &c); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		h.t.Fatalf("read stash: %v", err)
	}
	return h.withH2(h.connView(c), h.objs.H2Stash)
}

func viewOf(p *modelPod, c *modelConn) modelView {
	v := modelView{
		InFlight: p.inFlight, Started: int64(p.started), Completed: int64(p.completed),
		Probes: int64(p.probes), OpaqueInFlight: p.opaqueInFlight, OpaqueTotal: int64(p.opaqueTotal),
		H2InFlight: p.h2InFlight, H2Total: int64(p.h2Total),
		Events: p.events,
		RxNext: c.rxNext, TxNext: c.txNext, Pushed: c.pushed, Popped: c.popped, HeadBits: c.headBits, ProbeBits: c.probeBits,
		Seen: c.seen, Load: c.load, Answered: c.answered, Opaque: c.opaque, Tunnel: c.tunnel, RxGap: c.rxGap,
		GapSeq: c.gapSeq, GapEnd: c.gapEnd, Rx: modelMsgView(c.rx), Tx: modelMsgView(c.tx),
		H2: c.h2,
	}
	if h := c.h2s; h != nil {
		v.H2Rx = h2DirView{Left: h.rx.left, Frames: h.rx.frames, Have: uint8(h.rx.have), Hdr: h.rx.hdr}
		v.H2Tx = h2DirView{Left: h.tx.left, Frames: h.tx.frames, Have: uint8(h.tx.have), Hdr: h.tx.hdr}
		v.H2MaxStream, v.H2Ids = h.maxStream, h.ids
	}
	return v
}

// twin drives the BPF programs and the model with the same segments.
type twin struct {
	h     *progHarness
	pod   modelPod
	conn  *modelConn // nil before the accept
	stash *modelConn // the model's stash entry, before the accept
	steps []string
}

const rx0, tx0 = 1000, 5000

func newTwin(t *testing.T) *twin {
	h := newProgHarness(t)
	return &twin{h: h, conn: newModelConn(rx0, tx0, false)}
}

// unaccepted starts the twin's connection over, not accepted yet.
func (w *twin) unaccepted() {
	w.h.disconnect()
	w.conn = nil
}

func (w *twin) send(t *testing.T, s segment) {
	t.Helper()
	dir := "out"
	if s.ingress {
		dir = "in"
	}
	if w.conn == nil && !s.listen {
		// The connection is established before its first segment that
		// does not reach the listening socket.
		w.h.accept(rx0, tx0)
		payload := 0
		if w.stash != nil {
			payload = 1
		}
		w.conn = accept(&w.pod, w.stash, rx0, tx0, payload, false, true)
		w.stash = nil
		w.steps = append(w.steps, "accept")
		w.compare(t, w.h.view(), w.conn)
	}
	switch {
	case w.conn == nil:
		dir = "listen"
		w.h.listen(s.seq, string(s.payload), false)
		w.stash = listenMore(&w.pod, w.stash, s.seq, s.payload, true)
	case s.ingress:
		w.h.ingress(s.seq, string(s.payload))
		w.conn.ingress(&w.pod, s.seq, s.payload)
	default:
		w.h.egress(s.seq, string(s.payload))
		w.conn.egress(&w.pod, s.seq, s.payload)
	}
	w.steps = append(w.steps, fmt.Sprintf("%s seq=%d %q", dir, s.seq, truncate(s.payload)))
	if w.conn == nil {
		w.compare(t, w.h.stashView(), w.stash)
		return
	}
	w.compare(t, w.h.view(), w.conn)
}

func (w *twin) compare(t *testing.T, got modelView, c *modelConn) {
	t.Helper()
	if diff := cmp.Diff(viewOf(&w.pod, c), got); diff != "" {
		t.Fatalf("BPF differs from the model after:\n%s\n(-model +bpf):\n%s", strings.Join(w.steps, "\n"), diff)
	}
}

func truncate(b []byte) string {
	if len(b) > 120 {
		return string(b[:120]) + fmt.Sprintf("...(%d bytes)", len(b))
	}
	return string(b)
}

// exchange is one request and its response(s) as byte streams. An early
// response is sent after the request's headers and before its body
// (bodyAt: where the body starts in request).
type exchange struct {
	request, response []byte
	probe, endsConn   bool
	bodyAt            int
	early             bool
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
		if rng.IntN(3) == 0 {
			// A chunked body, with an extension and a trailer now and then.
			req.WriteString("Transfer-Encoding: chunked\r\n")
			var chunked bytes.Buffer
			for left := body; len(left) > 0; {
				n := min(len(left), 1+rng.IntN(1000))
				fmt.Fprintf(&chunked, "%x", n)
				if rng.IntN(3) == 0 {
					chunked.WriteString(";e=1")
				}
				chunked.WriteString("\r\n")
				chunked.Write(left[:n])
				chunked.WriteString("\r\n")
				left = left[n:]
			}
			chunked.WriteString("0\r\n")
			if rng.IntN(2) == 0 {
				chunked.WriteString("T: 1\r\n")
			}
			chunked.WriteString("\r\n")
			body = chunked.Bytes()
		} else {
			fmt.Fprintf(&req, "Content-Length: %d\r\n", len(body))
			if len(body) > 0 && rng.IntN(4) == 0 {
				req.WriteString("Expect: 100-continue\r\n")
				ex.early = true // answered before its body
			}
		}
	}
	req.WriteString("\r\n")
	ex.bodyAt = req.Len()
	req.Write(body)
	if method == "POST" && rng.IntN(3) == 0 {
		req.WriteString("\r\n") // an old client's CRLF after the body (RFC 9112 section 2.2)
	}
	ex.request = req.Bytes()

	var resp bytes.Buffer
	if ex.early {
		fmt.Fprintf(&resp, "HTTP/1.1 %s\r\nContent-Length: 0\r\n\r\n", []string{"413 Content Too Large", "401 Unauthorized"}[rng.IntN(2)])
		ex.response = resp.Bytes()
		return ex
	}
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

// conversation is a connection's random exchanges as segments: requests
// pipelined now and then (sent before the responses to the earlier ones),
// early responses before the rest of their bodies, and now and then the
// first client bytes before the accept. Besides the segments it says how
// many requests are load and how many probes, and whether the client's
// segments came reordered.
type conversation struct {
	segs            []segment
	load, probes    int
	reordered       bool
	beforeTheAccept bool
}

func randomConversation(rng *rand.Rand) conversation {
	var cv conversation
	rx, tx := uint32(rx0), uint32(tx0)
	var queued []exchange // requests sent, responses not yet
	flush := func() {
		for _, ex := range queued {
			cv.segs = append(cv.segs, cutStream(rng, false, tx, ex.response)...)
			tx += uint32(len(ex.response))
		}
		queued = nil
	}
	sendClient := func(start uint32, b []byte) {
		segs := cutStream(rng, true, start, b)
		if reorder(rng, segs) {
			cv.reordered = true
		}
		cv.segs = append(cv.segs, segs...)
	}
	for i := range 1 + rng.IntN(5) {
		ex := randomExchange(rng)
		// A probe on a connection that already carried load is load.
		if ex.probe && cv.load == 0 && len(queued) == 0 {
			cv.probes++
		} else {
			ex.probe = false
			cv.load++
		}
		switch {
		case ex.early:
			flush()
			sendClient(rx, ex.request[:ex.bodyAt])
			cv.segs = append(cv.segs, cutStream(rng, false, tx, ex.response)...)
			tx += uint32(len(ex.response))
			sendClient(rx+uint32(ex.bodyAt), ex.request[ex.bodyAt:])
		case !ex.probe && !ex.endsConn && rng.IntN(3) == 0:
			// Pipelined: sent now, answered with the next ones.
			sendClient(rx, ex.request)
			queued = append(queued, ex)
			rx += uint32(len(ex.request))
			continue
		default:
			sendClient(rx, ex.request)
			queued = append(queued, ex)
			flush()
		}
		if i == 0 && rng.IntN(4) == 0 && len(cv.segs) > 0 && cv.segs[0].ingress {
			cv.segs[0].listen = true // the segment that completes the handshake
			cv.beforeTheAccept = true
		}
		rx += uint32(len(ex.request))
		if ex.endsConn {
			break
		}
	}
	flush()
	return cv
}

func TestProgMatchesModelOnRandomExchanges(t *testing.T) {
	for seed := range uint64(80) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			cv := randomConversation(rng)
			w := newTwin(t)
			if cv.beforeTheAccept {
				w.unaccepted()
			}
			for _, s := range cv.segs {
				w.send(t, s)
			}
			// Beyond agreeing with the model, the counts must be right where
			// the parser missed no bytes it could not skip.
			got := w.h.view()
			if got.OpaqueTotal != 0 {
				t.Fatalf("opaque=%d, want 0\n%s", got.OpaqueTotal, strings.Join(w.steps, "\n"))
			}
			// A probe whose request is cut before its User-Agent counts as
			// load, and so does every later probe on its connection.
			if got.Events[evStreamGap] != 0 {
				return
			}
			if int(got.Started+got.Probes) != cv.load+cv.probes || int(got.Probes) > cv.probes {
				t.Fatalf("started=%d probes=%d, want %d requests, at most %d probes\n%s", got.Started, got.Probes, cv.load+cv.probes, cv.probes, strings.Join(w.steps, "\n"))
			}
			if got.Events != ([evMax]uint64{}) {
				t.Fatalf("events %v: the parser failed on valid HTTP/1.1\n%s", got.Events, strings.Join(w.steps, "\n"))
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
	// Reordered: the second part first.
	f.Add([]byte("\x05\x00\x0aGET / HTTP\x01\x00\x08/1.1\r\n\r\n\x00\x00\x26HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"))
	// Before the accept, pipelined.
	f.Add([]byte("\x09\x00\x20GET / HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\n\r\n\x00\x00\x26HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"))
	// HTTP/2: a preface and a call, answered.
	f.Add([]byte("\x01\x00\x3bPRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x05\x01\x05\x00\x00\x00\x01\x82\x86\x84\x41\x8a\x00\x00\x03\x00\x01\x00\x00\x00\x01abc" +
		"\x00\x00\x1b\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x01\x01\x04\x00\x00\x00\x01\x88\x00\x00\x02\x00\x01\x00\x00\x00\x01ok"))
	shared := newProgHarness(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		shared.t = t
		shared.reset()
		w := &twin{h: shared, conn: newModelConn(rx0, tx0, false)}
		segs := fuzzSegments(data)
		if len(segs) > 0 && segs[0].listen {
			w.unaccepted()
		}
		for _, s := range segs {
			w.send(t, s)
		}
	})
}
