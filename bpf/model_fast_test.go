//go:build linux

package bpf

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// segment is one TCP segment of a test stream.
type segment struct {
	ingress bool
	seq     uint32
	payload []byte
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
			segs = append(segs, segment{ingress, start + uint32(from), b[from:to]})
			off = max(off, to)
			continue
		}
		segs = append(segs, segment{ingress, start + uint32(off), b[off : off+n]})
		off += n
	}
	return segs
}

// randomSegments cuts a few random exchanges into random segments, as
// TestProgMatchesModelOnRandomExchanges sends them.
func randomSegments(rng *rand.Rand) []segment {
	var segs []segment
	rx, tx := uint32(rx0), uint32(tx0)
	for range 1 + rng.IntN(5) {
		ex := randomExchange(rng)
		segs = append(segs, cutStream(rng, true, rx, ex.request)...)
		rx += uint32(len(ex.request))
		segs = append(segs, cutStream(rng, false, tx, ex.response)...)
		tx += uint32(len(ex.response))
		if ex.endsConn {
			break
		}
	}
	return segs
}

// fuzzSegments decodes a fuzz input into segments. Input: records of
// [flags][len hi][len lo][bytes...]; flags bit 0 = client to server, bit 1 =
// retransmit from an older offset (7 bytes per unit of flags>>2).
func fuzzSegments(data []byte) []segment {
	var segs []segment
	rx, tx := uint32(rx0), uint32(tx0)
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
			seq -= uint32(flags>>2) * 7 // an older offset
		}
		segs = append(segs, segment{ingress, seq, chunk})
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
	var fastPod, slowPod modelPod
	fast, slow := newModelConn(rx0, tx0, false), newModelConn(rx0, tx0, false)
	feed := func(c *modelConn, p *modelPod, s segment) {
		if s.ingress {
			c.ingress(p, s.seq, s.payload)
		} else {
			c.egress(p, s.seq, s.payload)
		}
	}
	for i, s := range segs {
		modelFastPaths = true
		feed(fast, &fastPod, s)
		modelFastPaths = false
		feed(slow, &slowPod, s)
		want, got := viewOf(&slowPod, slow), viewOf(&fastPod, fast)
		if want.Opaque && got.Opaque {
			want.State, want.Hflags, want.Pos, want.Status, want.Hash, want.Length, want.Remaining = 0, 0, 0, 0, 0, 0, 0
			got.State, got.Hflags, got.Pos, got.Status, got.Hash, got.Length, got.Remaining = 0, 0, 0, 0, 0, 0, 0
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("fast paths differ from byte-by-byte parsing after segment %d (in=%v seq=%d %q) (-bytes +fast):\n%s",
				i, s.ingress, s.seq, truncate(s.payload), diff)
		}
	}
}

func TestModelFastPathsMatchByteParsing(t *testing.T) {
	for seed := range uint64(2000) {
		rng := rand.New(rand.NewPCG(seed, 11))
		t.Run(fmt.Sprint(seed), func(t *testing.T) { checkFastPaths(t, randomSegments(rng)) })
	}
}

// FuzzModelFastPaths compares the model's fast paths with byte-by-byte
// parsing on arbitrary segment streams (see fuzzSegments).
func FuzzModelFastPaths(f *testing.F) {
	f.Add([]byte("\x01\x00\x2cGET / HTTP/1.1\r\nUser-Agent: kube-probe/1.3\r\n\r\n"))
	f.Add([]byte("\x01\x00\x05GET /\x00\x00\x2cHTTP/1.1 200 OK\r\nContent-Length: 0\r\nX: y\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) { checkFastPaths(t, fuzzSegments(data)) })
}
