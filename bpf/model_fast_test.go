//go:build linux

package bpf

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// segment is one TCP segment of a test stream.
type segment struct {
	ingress bool
	seq     uint32
	payload []byte
	listen  bool // it reaches the listening socket: the connection is not accepted yet
}

// cutStream cuts b, sent from sequence number start, into random segments
// with random retransmissions of what was already sent.
func cutStream(rng *rand.Rand, ingress bool, start uint32, b []byte) []segment {
	var segs []segment
	for off := 0; off < len(b); {
		n := min(len(b)-off, 1+rng.IntN(3000))
		if rng.IntN(6) == 0 && off > 0 {
			// Retransmit an old range, sometimes running into new bytes.
			from := rng.IntN(off)
			to := min(len(b), off+rng.IntN(2)*rng.IntN(200))
			if to-from > 3000 {
				from = to - 3000
			}
			segs = append(segs, segment{ingress: ingress, seq: start + uint32(from), payload: b[from:to]})
			off = max(off, to)
			continue
		}
		segs = append(segs, segment{ingress: ingress, seq: start + uint32(off), payload: b[off : off+n]})
		off += n
	}
	return segs
}

// reorder swaps, now and then, a segment of segs with the one after it, as
// a network that reorders or loses a segment (and retransmits it later)
// delivers them to ingress, which runs before TCP orders them. Returns
// whether it swapped any.
func reorder(rng *rand.Rand, segs []segment) bool {
	swapped := false
	for i := 0; i+1 < len(segs); i++ {
		if rng.IntN(8) == 0 {
			segs[i], segs[i+1] = segs[i+1], segs[i]
			swapped = true
			i++
		}
	}
	return swapped
}

// fuzzSegments decodes a fuzz input into segments. Input: records of
// [flags][len hi][len lo][bytes...]; flags bit 0 = client to server, bit 1 =
// retransmit from an older offset (7 bytes per unit of flags>>4), bit 2 =
// client to server: comes after the next record's segment (reordered), bit
// 3 = client to server, before any segment that is not: reaches the
// listening socket, before the accept.
func fuzzSegments(data []byte) []segment {
	var segs []segment
	rx, tx := uint32(rx0), uint32(tx0)
	held := -1 // index of a segment to swap with the next
	accepted := false
	for len(data) >= 3 {
		flags := data[0]
		n := min(int(binary.BigEndian.Uint16(data[1:3]))%3001, len(data)-3)
		chunk := data[3 : 3+n]
		data = data[3+n:]
		if n == 0 {
			continue
		}
		ingress := flags&1 == 1
		next := &tx
		if ingress {
			next = &rx
		}
		seq := *next
		if flags&2 != 0 {
			seq -= uint32(flags>>4) * 7 // an older offset
		}
		listen := ingress && !accepted && flags&8 != 0
		accepted = accepted || !listen
		segs = append(segs, segment{ingress: ingress, seq: seq, payload: chunk, listen: listen})
		if held >= 0 && !listen {
			segs[held], segs[len(segs)-1] = segs[len(segs)-1], segs[held]
			held = -1
		} else if ingress && !listen && flags&4 != 0 {
			held = len(segs) - 1
		}
		if int32(seq+uint32(n)-*next) > 0 {
			*next = seq + uint32(n)
		}
	}
	return segs
}

// checkFastPaths feeds segs to the model twice, with its fast paths and
// byte by byte, and fails at the first segment after which they disagree.
// Parser state is compared while the connection is parsed; once it is
// accounted at connection level only the counters matter.
func checkFastPaths(t *testing.T, segs []segment) {
	t.Helper()
	defer func() { modelFastPaths = true }()
	type side struct {
		pod         modelPod
		conn, stash *modelConn
	}
	var fast, slow side
	start := func(s *side) {
		if len(segs) == 0 || !segs[0].listen {
			s.conn = newModelConn(rx0, tx0, false)
		}
	}
	start(&fast)
	start(&slow)
	feed := func(s *side, seg segment) *modelConn {
		if s.conn == nil && !seg.listen {
			payload := 0
			if s.stash != nil {
				payload = 1
			}
			s.conn = accept(&s.pod, s.stash, rx0, tx0, payload, false, true)
		}
		switch {
		case s.conn == nil:
			s.stash = listenMore(&s.pod, s.stash, seg.seq, seg.payload, true)
			return s.stash
		case seg.ingress:
			s.conn.ingress(&s.pod, seg.seq, seg.payload)
		default:
			s.conn.egress(&s.pod, seg.seq, seg.payload)
		}
		return s.conn
	}
	for i, seg := range segs {
		modelFastPaths = true
		fc := feed(&fast, seg)
		modelFastPaths = false
		sc := feed(&slow, seg)
		want, got := viewOf(&slow.pod, sc), viewOf(&fast.pod, fc)
		if want.Opaque && got.Opaque {
			want.Rx, want.Tx, got.Rx, got.Tx = msgView{}, msgView{}, msgView{}, msgView{}
		}
		for _, m := range []*msgView{&want.Rx, &want.Tx, &got.Rx, &got.Tx} {
			m.canonical()
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("fast paths differ from byte-by-byte parsing after segment %d (in=%v seq=%d %q) (-bytes +fast):\n%s",
				i, seg.ingress, seg.seq, truncate(seg.payload), diff)
		}
	}
}

// canonical forgets what differs between the fast paths and parsing byte
// by byte, and matters to neither: in a line that does not matter, byte by
// byte parses its name up to the colon (MS_NAME) where the fast paths skip
// it whole; and in states that start the next token afresh, the last one
// stays behind. Where a skipped line did matter, the states after the next
// segments differ.
func (m *msgView) canonical() {
	switch m.State {
	case msName:
		m.State = msSkipLine
		fallthrough
	case msSkipLine, msLineStart, msHeadersLF, msBody, msChunkData, msChunkEnd,
		msTrailerStart, msTrailerSkip, msTrailerLF, msUntilClose, msLost:
		m.Pos, m.Hash = 0, 0
	}
}

func TestModelFastPathsMatchByteParsing(t *testing.T) {
	for seed := range uint64(2000) {
		rng := rand.New(rand.NewPCG(seed, 11))
		t.Run(fmt.Sprint(seed), func(t *testing.T) { checkFastPaths(t, randomConversation(rng).segs) })
	}
}

// FuzzModelFastPaths compares the model's fast paths with byte-by-byte
// parsing on arbitrary segment streams (see fuzzSegments).
func FuzzModelFastPaths(f *testing.F) {
	f.Add([]byte("\x01\x00\x2cGET / HTTP/1.1\r\nUser-Agent: kube-probe/1.3\r\n\r\n"))
	f.Add([]byte("\x01\x00\x05GET /\x00\x00\x2cHTTP/1.1 200 OK\r\nContent-Length: 0\r\nX: y\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) { checkFastPaths(t, fuzzSegments(data)) })
}

// TestModelFollowsSegmentsOver64KiB: with IPv4 BIG TCP a GSO segment (and
// a GRO one on receipt) carries up to 512 KiB, and the parser skips body
// bytes by count across it (BPF_PROG_TEST_RUN builds no packet over a
// page; TestKernelBigTCP sends them through a real link).
func TestModelFollowsSegmentsOver64KiB(t *testing.T) {
	var p modelPod
	c := newModelConn(rx0, tx0, false)
	rx, tx := uint32(rx0), uint32(tx0)
	body := strings.Repeat("b", 300<<10)
	for range 3 {
		post := "POST /u HTTP/1.1\r\nHost: a\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
		get := "GET /x HTTP/1.1\r\nHost: a\r\n\r\n"
		resp := "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
		// A request and its body in one segment, the next request after.
		c.ingress(&p, rx, []byte(post+get))
		rx += uint32(len(post + get))
		// A response over two segments of 160 and 140 KiB.
		c.egress(&p, tx, []byte(resp[:160<<10]))
		c.egress(&p, tx+160<<10, []byte(resp[160<<10:]+resp))
		tx += uint32(2 * len(resp))
	}
	want := modelPod{started: 6, completed: 6, now: p.now}
	if diff := cmp.Diff(want, p, cmp.AllowUnexported(modelPod{})); diff != "" {
		t.Errorf("pod (-want +got):\n%s", diff)
	}
}
