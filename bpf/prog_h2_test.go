//go:build linux

package bpf

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2Frames writes HTTP/2 frames with the x/net framer, as real clients
// and servers do.
type h2Frames struct {
	buf bytes.Buffer
	fr  *http2.Framer
	enc *hpack.Encoder
	hb  bytes.Buffer
}

func newH2Frames() *h2Frames {
	f := &h2Frames{}
	f.fr = http2.NewFramer(&f.buf, nil)
	f.enc = hpack.NewEncoder(&f.hb)
	return f
}

// take returns what was written since the last take.
func (f *h2Frames) take() string {
	s := f.buf.String()
	f.buf.Reset()
	return s
}

func (f *h2Frames) headers(stream uint32, endStream bool, fields ...string) *h2Frames {
	f.hb.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		_ = f.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	_ = f.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: f.hb.Bytes(), EndStream: endStream, EndHeaders: true})
	return f
}

func (f *h2Frames) request(stream uint32) *h2Frames {
	return f.headers(stream, false, ":method", "POST", ":scheme", "http", ":path", "/echo.Echo/Say", ":authority", "pod", "content-type", "application/grpc")
}

func (f *h2Frames) data(stream uint32, n int, endStream bool) *h2Frames {
	_ = f.fr.WriteData(stream, endStream, make([]byte, n))
	return f
}

func (f *h2Frames) settings() *h2Frames {
	_ = f.fr.WriteSettings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: 1000}, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
	return f
}

func (f *h2Frames) rst(stream uint32) *h2Frames {
	_ = f.fr.WriteRSTStream(stream, http2.ErrCodeCancel)
	return f
}

func (f *h2Frames) goAway(last uint32) *h2Frames {
	_ = f.fr.WriteGoAway(last, http2.ErrCodeNo, nil)
	return f
}

func (f *h2Frames) ping() *h2Frames {
	_ = f.fr.WritePing(false, [8]byte{1, 2, 3, 4, 5, 6, 7, 8})
	return f
}

func (f *h2Frames) windowUpdate(stream uint32) *h2Frames {
	_ = f.fr.WriteWindowUpdate(stream, 1<<16)
	return f
}

// response writes a gRPC response: headers, a message, trailers that end
// the stream.
func (f *h2Frames) response(stream uint32, n int) *h2Frames {
	f.headers(stream, false, ":status", "200", "content-type", "application/grpc")
	f.data(stream, n, false)
	return f.headers(stream, true, "grpc-status", "0")
}

// h2Exchange is a scripted HTTP/2 exchange: client and server bytes with
// their sequence offsets kept for the test.
type h2Exchange struct {
	h        *progHarness
	rx, tx   uint32 // next sequence offsets (from 1000 and 5000)
	cli, srv *h2Frames
}

func newH2Exchange(h *progHarness) *h2Exchange {
	return &h2Exchange{h: h, cli: newH2Frames(), srv: newH2Frames()}
}

func (x *h2Exchange) in(s string) {
	x.h.t.Helper()
	x.h.ingress(1000+x.rx, s)
	x.rx += uint32(len(s))
}

func (x *h2Exchange) out(s string) {
	x.h.t.Helper()
	x.h.egress(5000+x.tx, s)
	x.tx += uint32(len(s))
}

// TestProgHTTP2Streams: over HTTP/2 with prior knowledge, every stream is
// a request, in flight from the client's HEADERS to the server's
// END_STREAM, a RST_STREAM from either side, or a GOAWAY that leaves it
// out, however frames fall into segments.
func TestProgHTTP2Streams(t *testing.T) {
	cli, srv, preface := cliStep, srvStep, prefaceStep
	srvPreface := srv(func(s *h2Frames) { s.settings() })
	type step = h2Step
	tests := []struct {
		name  string
		steps []step
		want  counts
	}{
		{"one call, answered", []step{preface, srvPreface,
			cli(func(c *h2Frames) { c.request(1).data(1, 20, true) }),
			srv(func(s *h2Frames) { s.response(1, 30) })},
			counts{Started: 1, Completed: 1}},
		{"three calls in flight on one connection, one answered", []step{preface, srvPreface,
			cli(func(c *h2Frames) {
				c.request(1).data(1, 5, true).request(3).data(3, 5, true).request(5).data(5, 5, true)
			}),
			srv(func(s *h2Frames) { s.response(3, 10) })},
			counts{InFlight: 2, Started: 3, Completed: 1}},
		{"the server's SETTINGS before the client's preface", []step{srvPreface, preface,
			cli(func(c *h2Frames) { c.request(1) })},
			counts{InFlight: 1, Started: 1}},
		{"trailers from the client do not open a stream", []step{preface,
			cli(func(c *h2Frames) { c.request(1).data(1, 5, false).headers(1, true, "x-trailer", "1") })},
			counts{InFlight: 1, Started: 1}},
		{"the client cancels (RST_STREAM)", []step{preface,
			cli(func(c *h2Frames) { c.request(1).request(3) }),
			cli(func(c *h2Frames) { c.rst(1) })},
			counts{InFlight: 1, Started: 2, Completed: 1}},
		{"the server resets, then resets again: counted once", []step{preface,
			cli(func(c *h2Frames) { c.request(1) }),
			srv(func(s *h2Frames) { s.rst(1).rst(1) })},
			counts{Started: 1, Completed: 1}},
		{"an answer after END_STREAM and a RST_STREAM(NO_ERROR): counted once", []step{preface,
			cli(func(c *h2Frames) { c.request(1) }),
			srv(func(s *h2Frames) { s.response(1, 5).rst(1) })},
			counts{Started: 1, Completed: 1}},
		{"GOAWAY ends the streams beyond its last", []step{preface,
			cli(func(c *h2Frames) { c.request(1).request(3).request(5) }),
			srv(func(s *h2Frames) { s.goAway(1) })},
			counts{InFlight: 1, Started: 3, Completed: 2}},
		{"PING, WINDOW_UPDATE and SETTINGS acks are no requests", []step{preface, srvPreface,
			cli(func(c *h2Frames) { c.ping().windowUpdate(0); _ = c.fr.WriteSettingsAck() }),
			srv(func(s *h2Frames) { s.ping().windowUpdate(0) })},
			counts{}},
		{"a large message skipped by count", []step{preface,
			cli(func(c *h2Frames) { c.request(1).data(1, 1000, false) }),
			cli(func(c *h2Frames) { c.data(1, 1000, true).request(3) })},
			counts{InFlight: 2, Started: 2}},
		{"the server's SETTINGS first, then a client that is not HTTP/2: connection level", []step{srvPreface,
			{true, func(*h2Exchange) string { return "GET / HTTP/1.1\r\nHost: a\r\n\r\n" }}},
			counts{InFlight: 1, Started: 1, OpaqueInFlight: 1, OpaqueTotal: 1}},
		{"a client that is not HTTP/2 after the preface falls back", []step{
			{true, func(*h2Exchange) string { return h2ClientPreface + "GET / HTTP/1.1\r\n\r\n" }}},
			counts{InFlight: 1, Started: 1, OpaqueInFlight: 1, OpaqueTotal: 1}},
		{"a framing error after streams: they end, the connection is one", []step{preface,
			cli(func(c *h2Frames) { c.request(1).request(3) }),
			{true, func(*h2Exchange) string { return "\x00\x00\x00\x04\x00\x00\x00\x00\x07" }}}, // SETTINGS on a stream
			counts{InFlight: 1, Started: 3, Completed: 2, OpaqueInFlight: 1, OpaqueTotal: 1}},
	}
	for _, fam := range families(t) {
		t.Run(fam.name, func(t *testing.T) {
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					h := fam.harness(t)
					h.connect(1000, 5000, false)
					newH2Exchange(h).play(tt.steps)
					if diff := cmp.Diff(tt.want, h.counts()); diff != "" {
						t.Errorf("counts (-want +got):\n%s", diff)
					}
				})
			}
		})
	}
}

// h2Step is one segment of a scripted exchange: client bytes (in) or
// server bytes, written by data.
type h2Step struct {
	in   bool
	data func(x *h2Exchange) string
}

// cliStep and srvStep are the client's and the server's frames that f
// writes; prefaceStep the client's preface and SETTINGS.
func cliStep(f func(c *h2Frames)) h2Step {
	return h2Step{true, func(x *h2Exchange) string { f(x.cli); return x.cli.take() }}
}

func srvStep(f func(s *h2Frames)) h2Step {
	return h2Step{false, func(x *h2Exchange) string { f(x.srv); return x.srv.take() }}
}

var prefaceStep = h2Step{true, func(x *h2Exchange) string { x.cli.settings(); return h2ClientPreface + x.cli.take() }}

// play sends the steps' segments in order.
func (x *h2Exchange) play(steps []h2Step) {
	x.h.t.Helper()
	for _, s := range steps {
		if d := s.data(x); s.in {
			x.in(d)
		} else {
			x.out(d)
		}
	}
}

// TestProgHTTP2LargeFrames: a message of many segments is skipped by
// count, and the frames after it are found.
func TestProgHTTP2LargeFrames(t *testing.T) {
	f := newH2Frames()
	f.settings().request(1).data(1, 16000, true).request(3)
	req := h2ClientPreface + f.take()
	f.response(1, 16000)
	resp := f.take()
	h := newProgHarness(t)
	h.connect(1000, 5000, false)
	for off := 0; off < len(req); off += 1400 {
		h.ingress(1000+uint32(off), req[off:min(off+1400, len(req))])
	}
	for off := 0; off < len(resp); off += 1400 {
		h.egress(5000+uint32(off), resp[off:min(off+1400, len(resp))])
	}
	if got := h.counts(); got != (counts{InFlight: 1, Started: 2, Completed: 1}) {
		t.Errorf("%+v, want 2 started, 1 completed, 1 in flight", got)
	}
}

// TestProgHTTP2Connections: the pod counts the connections it follows as
// HTTP/2; one that falls back to connection level moves to the opaque
// count.
func TestProgHTTP2Connections(t *testing.T) {
	h := newProgHarness(t)
	x := newH2Exchange(h)
	x.cli.settings()
	x.in(h2ClientPreface + x.cli.take())
	if s := h.stats(); s.H2InFlight != 1 || s.H2Total != 1 || s.OpaqueInFlight != 0 {
		t.Errorf("after the preface: h2 %d in flight, %d total, %d opaque; want 1, 1, 0", s.H2InFlight, s.H2Total, s.OpaqueInFlight)
	}
	x.in("\x00\x00\x00\x04\x00\x00\x00\x00\x07") // SETTINGS on a stream
	if s := h.stats(); s.H2InFlight != 0 || s.H2Total != 1 || s.OpaqueInFlight != 1 {
		t.Errorf("after a framing error: h2 %d in flight, %d total, %d opaque; want 0, 1, 1", s.H2InFlight, s.H2Total, s.OpaqueInFlight)
	}
}

// TestProgHTTP2SplitAnywhere: a call's bytes cut at every point into two
// segments, both directions: frame headers split over segments are put
// together, payloads skipped by count across them.
func TestProgHTTP2SplitAnywhere(t *testing.T) {
	f := newH2Frames()
	f.settings().request(1).data(1, 40, true).request(3)
	req := h2ClientPreface + f.take()
	f.settings().response(1, 40).response(3, 5)
	resp := f.take()
	h := newProgHarness(t)
	for cut := 25; cut < len(req); cut++ { // the preface itself comes whole
		h.reset()
		h.connect(1000, 5000, false)
		h.ingress(1000, req[:cut])
		h.ingress(1000+uint32(cut), req[cut:])
		if got := h.counts(); got != (counts{InFlight: 2, Started: 2}) {
			t.Fatalf("requests cut at %d: %+v, want 2 in flight", cut, got)
		}
	}
	for cut := 1; cut < len(resp); cut++ {
		h.reset()
		h.connect(1000, 5000, false)
		h.ingress(1000, req)
		h.egress(5000, resp[:cut])
		h.egress(5000+uint32(cut), resp[cut:])
		if got := h.counts(); got != (counts{Started: 2, Completed: 2}) {
			t.Fatalf("responses cut at %d: %+v, want 2 completed", cut, got)
		}
	}
}

// TestProgHTTP2StreamLimit: MAX_H2_STREAMS streams in flight on one
// connection are followed exactly; one beyond is not counted (an event
// says so), and their ends never take the count below zero. An
// activator's streams count as proxied too.
func TestProgHTTP2StreamLimit(t *testing.T) {
	h := newProgHarness(t)
	h.connect(1000, 5000, true)
	x := newH2Exchange(h)
	x.cli.settings()
	x.in(h2ClientPreface + x.cli.take())
	before := h.events()
	const n = maxH2Streams + 2
	for i := range uint32(n) {
		x.cli.request(2*i + 1)
		x.in(x.cli.take())
	}
	want := counts{InFlight: maxH2Streams, Started: maxH2Streams, ProxiedInFlight: maxH2Streams, ProxiedStarted: maxH2Streams}
	if got := h.counts(); got != want {
		t.Errorf("%d streams opened: %+v, want %+v", n, got, want)
	}
	if full := h.events()[evH2Full] - before[evH2Full]; full != 2 {
		t.Errorf("%d streams not followed, want 2", full)
	}
	for i := range uint32(n) {
		x.srv.response(2*i+1, 3)
		x.out(x.srv.take())
	}
	want = counts{Started: maxH2Streams, Completed: maxH2Streams, ProxiedStarted: maxH2Streams}
	if got := h.counts(); got != want {
		t.Errorf("all answered: %+v, want %+v", got, want)
	}
}

// randomH2Conversation is a random HTTP/2 exchange, both directions' bytes
// cut into random segments (with retransmissions, the client's sometimes
// reordered), in an order a real exchange could have: a stream's
// response after its request. It returns the segments and how many
// streams the client opened.
func randomH2Conversation(rng *rand.Rand) (segs []segment, streams int, reordered bool) {
	cli, srv := newH2Frames(), newH2Frames()
	rx, tx := uint32(rx0), uint32(tx0)
	send := func(ingress bool, b []byte) {
		start := &tx
		if ingress {
			start = &rx
		}
		s := cutStream(rng, ingress, *start, b)
		if ingress && reorder(rng, s) {
			reordered = true
		}
		segs = append(segs, s...)
		*start += uint32(len(b))
	}
	cli.settings()
	if rng.IntN(3) == 0 { // a server that writes its SETTINGS first
		srv.settings()
		send(false, []byte(srv.take()))
	}
	send(true, append([]byte(h2ClientPreface), cli.take()...))
	var open []uint32
	next := uint32(1)
	for range 1 + rng.IntN(12) {
		switch k := rng.IntN(10); {
		case k < 4 || len(open) == 0: // new calls
			for range 1 + rng.IntN(4) {
				if rng.IntN(3) == 0 { // a prober's agent, or another (lib/hpack.h)
					cli.grpcProbe(next, []string{kubeletUA, "sockscale-probe/readiness", "grpc-go/1.79.3"}[rng.IntN(3)])
				} else {
					cli.request(next)
				}
				if rng.IntN(2) == 0 {
					cli.data(next, rng.IntN(5000), rng.IntN(2) == 0)
				}
				open = append(open, next)
				next += 2
				streams++
			}
			send(true, []byte(cli.take()))
		case k < 8: // answers, in any order
			rng.Shuffle(len(open), func(i, j int) { open[i], open[j] = open[j], open[i] })
			n := 1 + rng.IntN(len(open))
			for _, id := range open[:n] {
				if rng.IntN(5) == 0 {
					srv.rst(id)
				} else {
					srv.response(id, rng.IntN(5000))
				}
			}
			open = open[n:]
			if rng.IntN(3) == 0 {
				srv.ping().windowUpdate(0)
			}
			send(false, []byte(srv.take()))
		case k < 9: // a cancel
			cli.rst(open[0])
			open = open[1:]
			send(true, []byte(cli.take()))
		default: // connection frames
			cli.ping().windowUpdate(0)
			send(true, []byte(cli.take()))
		}
	}
	return segs, streams, reordered
}

// TestProgMatchesModelOnHTTP2: the programs and the model agree on random
// HTTP/2 exchanges segment by segment, and where no client byte came ahead
// of a hole, every stream the client opened counts once, ended or not.
func TestProgMatchesModelOnHTTP2(t *testing.T) {
	for seed := range uint64(60) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 11))
			segs, streams, reordered := randomH2Conversation(rng)
			w := newTwin(t)
			for _, s := range segs {
				w.send(t, s)
			}
			got := w.h.view()
			t.Logf("%d segments, %d streams: started %d, completed %d, in flight %d, probes %d, opaque %d", len(segs), streams, got.Started, got.Completed, got.InFlight, got.Probes, got.OpaqueTotal)
			if got.H2 != h2Follow {
				t.Fatalf("not followed as HTTP/2 (h2=%d)\n%s", got.H2, strings.Join(w.steps, "\n"))
			}
			if reordered {
				return // a hole may land in a frame header: then connection level, as the model says
			}
			// Each stream is load or a probe.
			if got.OpaqueTotal != 0 || int(got.Started+got.Probes) != streams || got.Events != ([evMax]uint64{}) {
				t.Fatalf("started=%d probes=%d opaque=%d events=%v, want %d streams started or probes, none opaque, no events\n%s",
					got.Started, got.Probes, got.OpaqueTotal, got.Events, streams, strings.Join(w.steps, "\n"))
			}
		})
	}
}

// TestProgMatchesModelServerFirst: the programs and the model agree where
// the server writes its SETTINGS first, whether the client then speaks
// HTTP/2 or not.
func TestProgMatchesModelServerFirst(t *testing.T) {
	f := newH2Frames()
	settings := []byte(f.settings().take())
	calls := []byte(h2ClientPreface + f.settings().request(1).take())
	for name, client := range map[string][]byte{"HTTP/2": calls, "HTTP/1.1": []byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n")} {
		t.Run(name, func(t *testing.T) {
			w := newTwin(t)
			w.send(t, segment{ingress: false, seq: tx0, payload: settings})
			w.send(t, segment{ingress: true, seq: rx0, payload: client})
		})
	}
}

// TestProgHTTP2PrefaceBeforeAccept: a client's preface (with its SETTINGS
// and WINDOW_UPDATE, as Go's and grpc-go's clients write them at once)
// may reach the listening socket before the accept, alone or with the
// first request; the connection is followed as HTTP/2 from there, the
// streams of that first segment walked before the accept and counted
// from it. A first segment that is no preface goes the HTTP/1 way.
func TestProgHTTP2PrefaceBeforeAccept(t *testing.T) {
	f := newH2Frames()
	settings := f.settings().take()
	windowUpdate := f.windowUpdate(0).take()
	call := f.request(1).data(1, 5, true).take()
	probe := f.grpcProbe(1, kubeletUA).data(1, 5, true).take()
	answer := f.settings().response(1, 9).take()
	tests := []struct {
		name     string
		first    string
		followed bool
		probe    bool // the first segment's stream is a health probe
	}{
		{"the preface alone", h2ClientPreface, true, false},
		{"the preface and SETTINGS", h2ClientPreface + settings, true, false},
		{"the preface, SETTINGS and WINDOW_UPDATE", h2ClientPreface + settings + windowUpdate, true, false},
		{"a call with the preface", h2ClientPreface + settings + windowUpdate + call, true, false},
		{"a probe with the preface", h2ClientPreface + settings + probe, true, true},
		{"the preface and a WINDOW_UPDATE first: not HTTP/2", h2ClientPreface + windowUpdate + call, false, false},
		{"SETTINGS cut by the segment", h2ClientPreface + settings[:12], true, false},
		{"no preface", "GET / HTTP/1.1\r\nHost: pod\r\n\r\n", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, serverFirst := range []bool{false, true} {
				w := newTwin(t)
				w.unaccepted()
				rx := uint32(rx0)
				w.send(t, segment{ingress: true, seq: rx, payload: []byte(tt.first), listen: true})
				rx += uint32(len(tt.first))
				if serverFirst {
					w.send(t, segment{ingress: false, seq: tx0, payload: []byte(answer[:len(settings)])})
				}
				withStream := strings.HasSuffix(tt.first, call) || strings.HasSuffix(tt.first, probe)
				if tt.followed && !withStream {
					if strings.HasSuffix(tt.first, settings[:12]) {
						w.send(t, segment{ingress: true, seq: rx, payload: []byte(settings[12:])})
						rx += uint32(len(settings) - 12)
					}
					w.send(t, segment{ingress: true, seq: rx, payload: []byte(call)})
				}
				w.send(t, segment{ingress: false, seq: tx0, payload: []byte(answer)})
				got, n := w.h.view(), w.h.counts()
				want := counts{Started: 1, Completed: 1}
				if tt.probe {
					want = counts{Probes: 1}
				}
				if tt.followed && (got.H2 != h2Follow || n != want) {
					t.Errorf("server first %t: h2=%d %+v, want %+v followed as HTTP/2\n%s",
						serverFirst, got.H2, n, want, strings.Join(w.steps, "\n"))
				}
				if !tt.followed && got.H2 == h2Follow && n.OpaqueTotal == 0 {
					t.Errorf("followed as HTTP/2, want the HTTP/1 way or connection level\n%s", strings.Join(w.steps, "\n"))
				}
			}
		})
	}
}

// TestProgTwoSegmentsBeforeAccept: a second client segment may reach the
// listening socket too, while another CPU turns the first into the
// connection; the stash entry goes on with it (a segment sent again
// starts afresh), HTTP/2 frames and HTTP/1 requests alike.
func TestProgTwoSegmentsBeforeAccept(t *testing.T) {
	f := newH2Frames()
	first := h2ClientPreface + f.settings().windowUpdate(0).take()
	call1 := f.request(1).data(1, 5, true).take()
	call3 := f.request(3).data(3, 5, true).take()
	answer1 := f.settings().response(1, 9).take()
	answers := answer1 + f.response(3, 9).take()
	get := "GET / HTTP/1.1\r\nHost: pod\r\n"
	tests := []struct {
		name     string
		segments []string // each reaches the listener, in sequence
		again    bool     // the first is sent again after the others
		answer   string
		want     counts
	}{
		{"the preface, then a call", []string{first, call1}, false, answer1, counts{Started: 1, Completed: 1}},
		{"a call with the preface, then another", []string{first + call1, call3}, false, answers, counts{Started: 2, Completed: 2}},
		{"an HTTP/1 request's headers over two segments", []string{get, "\r\n"}, false, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", counts{Started: 1, Completed: 1}},
		{"the first segment sent again", []string{first + call1}, true, answer1, counts{Started: 1, Completed: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newTwin(t)
			w.unaccepted()
			rx := uint32(rx0)
			for _, s := range tt.segments {
				w.send(t, segment{ingress: true, seq: rx, payload: []byte(s), listen: true})
				rx += uint32(len(s))
			}
			if tt.again {
				w.send(t, segment{ingress: true, seq: rx0, payload: []byte(tt.segments[0]), listen: true})
			}
			w.send(t, segment{ingress: false, seq: tx0, payload: []byte(tt.answer)})
			if got := w.h.counts(); got != tt.want {
				t.Errorf("%+v, want %+v\n%s", got, tt.want, strings.Join(w.steps, "\n"))
			}
		})
	}
}

// TestProgHTTP2Upgrade: HTTP/1.1's Upgrade to h2c (RFC 7540 section 3.2).
// The upgrading request is stream 1, in flight from its headers to the
// server's END_STREAM on stream 1 after the 101; the connection is
// followed as HTTP/2 from the server's SETTINGS after the 101 (in its
// segment or the next) or the client's preface, whichever comes first. A
// 101 to another protocol stays a tunnel: one request until it closes.
func TestProgHTTP2Upgrade(t *testing.T) {
	const upgrade = "GET / HTTP/1.1\r\nHost: pod\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
	const switching = "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"
	f := newH2Frames()
	settings := f.settings().take()
	answer1 := f.response(1, 9).take()
	call3 := f.request(3).data(3, 5, true).take()
	answer3 := f.response(3, 9).take()
	in, out := func(s string) segment { return segment{ingress: true, payload: []byte(s)} }, func(s string) segment { return segment{payload: []byte(s)} }
	tests := []struct {
		name string
		segs []segment
		want counts
		h2   uint8
	}{
		{"the 101 and the server's SETTINGS in one segment", []segment{in(upgrade), out(switching + settings + answer1), in(h2ClientPreface + settings + call3), out(answer3)},
			counts{Started: 2, Completed: 2}, h2Follow},
		{"the server's SETTINGS in the next segment", []segment{in(upgrade), out(switching), out(settings), in(h2ClientPreface + settings), out(answer1), in(call3), out(answer3)},
			counts{Started: 2, Completed: 2}, h2Follow},
		{"the client's preface before the server's SETTINGS", []segment{in(upgrade), out(switching), in(h2ClientPreface + settings + call3), out(settings + answer1 + answer3)},
			counts{Started: 2, Completed: 2}, h2Follow},
		{"stream 1 in flight until its answer", []segment{in(upgrade), out(switching + settings), in(h2ClientPreface + settings)},
			counts{InFlight: 1, Started: 1}, h2Upgraded},
		{"no preface after the server's SETTINGS: connection level", []segment{in(upgrade), out(switching + settings), in("hello")},
			counts{InFlight: 1, Started: 2, Completed: 1, OpaqueInFlight: 1, OpaqueTotal: 1}, h2Upgraded},
		{"a websocket stays a tunnel", []segment{in(upgrade), out("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"), in("\x81\x05hello"), out("\x81\x02ok")},
			counts{InFlight: 1, Started: 1}, h2None},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newTwin(t)
			rx, tx := uint32(rx0), uint32(tx0)
			for _, s := range tt.segs {
				if s.ingress {
					s.seq = rx
					rx += uint32(len(s.payload))
				} else {
					s.seq = tx
					tx += uint32(len(s.payload))
				}
				w.send(t, s)
			}
			got, n := w.h.view(), w.h.counts()
			// Upgraded turns followed at the client's preface.
			h2OK := got.H2 == tt.h2 || (tt.h2 == h2Upgraded && got.H2 == h2Follow)
			if n != tt.want || !h2OK {
				t.Errorf("h2=%d %+v, want h2=%d %+v\n%s", got.H2, n, tt.h2, tt.want, strings.Join(w.steps, "\n"))
			}
		})
	}
}
