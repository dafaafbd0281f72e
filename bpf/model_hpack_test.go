package bpf

// The model of lib/hpack.h: a health prober's User-Agent in the part of an
// HTTP/2 header block a segment has.

import (
	"strings"

	"golang.org/x/net/http2/hpack"
)

const (
	hpackMaxFields    = 24
	hpackUserAgent    = 58 // the static table's user-agent
	h2FlagPadded      = 0x8
	h2FlagPriority    = 0x20
	hpackMaxIntLength = 3 // continuation bytes of an integer the walk reads
)

// hpackInt mirrors hpack_int: an integer with an n-bit prefix at the start
// of b, and the bytes it took; ok is false where hpack_int returns -1.
func hpackInt(b []byte, n uint) (v uint32, used int, ok bool) {
	if len(b) == 0 {
		return 0, 0, false
	}
	max := uint32(1)<<n - 1
	if v = uint32(b[0]) & max; v < max {
		return v, 1, true
	}
	for i := range hpackMaxIntLength {
		if 1+i >= len(b) {
			return 0, 0, false
		}
		c := b[1+i]
		v += uint32(c&0x7f) << (7 * i)
		if c&0x80 == 0 {
			return v, 2 + i, true
		}
	}
	return 0, 0, false
}

// probeAgentValue mirrors probe_agent on the value bytes the segment has:
// its start decides. The coded prefixes are decoded here with x/net's
// Huffman decoder, which checks the programs' constants.
func probeAgentValue(v []byte, huffman bool) bool {
	if huffman {
		for _, prefix := range []string{"kube-probe/", "sockscale-probe/"} {
			n := hpack.HuffmanEncodeLength(prefix)
			if uint64(len(v)) < n {
				continue
			}
			if s, err := hpack.HuffmanDecodeToString(v[:n]); err == nil && s == prefix {
				return true
			}
		}
		return false
	}
	return strings.HasPrefix(string(v), "kube-probe/") || strings.HasPrefix(string(v), "sockscale-probe/")
}

// hpackProbe mirrors h2_probe_headers: p are the bytes of a HEADERS
// frame's payload that the segment has, n its length, flags its flags.
func hpackProbe(p []byte, n uint32, flags byte) bool {
	if flags&h2FlagPadded != 0 {
		if n == 0 || len(p) == 0 {
			return false
		}
		pad := uint32(p[0])
		p, n = p[1:], n-1
		if pad > n {
			return false
		}
		n -= pad
	}
	if flags&h2FlagPriority != 0 {
		if n < 5 {
			return false
		}
		p, n = p[min(5, len(p)):], n-5
	}
	if len(p) == 0 {
		return false
	}
	b := p[:min(uint32(len(p)), n)]
	for range hpackMaxFields {
		if len(b) == 0 {
			return false
		}
		first := b[0]
		switch {
		case first&0x80 != 0: // indexed
			_, used, ok := hpackInt(b, 7)
			if !ok {
				return false
			}
			b = b[used:]
			continue
		case first&0xe0 == 0x20: // dynamic table size update
			_, used, ok := hpackInt(b, 5)
			if !ok {
				return false
			}
			b = b[used:]
			continue
		}
		prefix := uint(4)
		if first&0xc0 == 0x40 {
			prefix = 6
		}
		index, used, ok := hpackInt(b, prefix)
		if !ok {
			return false
		}
		b = b[used:]
		if index == 0 {
			nameLen, used, ok := hpackInt(b, 7)
			if !ok {
				return false
			}
			b = b[min(uint32(len(b)), uint32(used)+nameLen):]
		}
		if len(b) == 0 {
			return false
		}
		huffman := b[0]&0x80 != 0
		valueLen, used, ok := hpackInt(b, 7)
		if !ok {
			return false
		}
		b = b[used:]
		if index == hpackUserAgent {
			return probeAgentValue(b[:min(uint32(len(b)), valueLen)], huffman)
		}
		b = b[min(uint32(len(b)), valueLen):]
	}
	return false
}
