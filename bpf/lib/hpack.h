// SPDX-License-Identifier: (MIT OR GPL-2.0)
// A health prober's User-Agent in an HTTP/2 header block (HPACK, RFC 7541),
// without decoding it: the block's fields are walked by their lengths, and
// only the value of a user-agent field is looked at, in its coded form.
//
// The kubelet's gRPC probe (grpc-go, "kube-probe/<version> grpc-go/...")
// and our activators' h2c probe ("sockscale-probe/...") open a new
// connection per probe, so the field is always a literal there: its name
// the static table's user-agent (index 58), its value Huffman-coded (both
// prefixes code to whole bytes: 8 and 11) or raw. A later request on the
// same connection refers to it in the connection's dynamic table, which is
// not followed: such a request is load, as is any whose User-Agent is not
// in the HEADERS frame's part of the segment that carries it.

#ifndef SOCKSCALE_LIB_HPACK_H
#define SOCKSCALE_LIB_HPACK_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "bytes.h"

#define HPACK_MAX_FIELDS 24      // fields of a header block looked at before the User-Agent
#define HPACK_USER_AGENT 58      // the static table's index of user-agent
#define H2_FLAG_PADDED 0x8       // HEADERS: a pad length byte first, padding last
#define H2_FLAG_PRIORITY 0x20    // HEADERS: 5 bytes of priority before the block

// The Huffman codes of "kube-probe/" (8 bytes) and "sockscale-probe/" (11
// bytes), as word() reads them; bpf/hpack_test.go checks them against
// golang.org/x/net/http2/hpack.
#define HUFF_KUBE_PROBE TOKEN8("\xeb\x6c\x65\x5a\xbb\x0f\x19\x58")
#define HUFF_SOCKSCALE_PROBE0 TOKEN8("\x41\xc9\xd5\x04\x1d\x05\x5a\xbb")
#define HUFF_SOCKSCALE_PROBE1 TOKEN8("\x0f\x19\x58\0\0\0\0\0")

// What the walk over one header block needs.
struct hpack_walk {
	struct __sk_buff *skb;
	__u32 off; // the next field's first byte
	__u32 end; // the end of the block's bytes in this segment
	int probe; // the result: 1 for a prober's User-Agent
};

// hpack_int reads an integer with an n-bit prefix (RFC 7541 section 5.1)
// at *off, moves *off past it and returns it; or returns -1 if its bytes
// are not all before end or it needs more than three more bytes (2^21 and
// more: no header this walk cares about is that long).
static __always_inline __s64 hpack_int(struct __sk_buff *skb, __u32 *off, __u32 end, __u8 n)
{
	__u8 b[4] = {};
	__u32 max = (1 << n) - 1, v, i;

	if (*off >= end || bpf_skb_load_bytes(skb, *off, b, 1))
		return -1;
	v = b[0] & max;
	(*off)++;
	if (v < max)
		return v;
	// Continuation bytes, 7 bits each, the last without its top bit.
#pragma clang loop unroll(full)
	for (i = 0; i < 3; i++) {
		if (*off >= end || bpf_skb_load_bytes(skb, *off, &b[i + 1], 1))
			return -1;
		(*off)++;
		v += (__u32)(b[i + 1] & 0x7f) << (7 * i);
		if (!(b[i + 1] & 0x80))
			return v;
	}
	return -1;
}

// probe_agent returns 1 if the string of len bytes at off (coded if
// huffman) starts with a prober's User-Agent prefix.
static __always_inline int probe_agent(struct __sk_buff *skb, __u32 off, __u32 end, __s64 len, int huffman)
{
	__u64 v[2] = {};

	if (len > end - off)
		len = end - off; // a value cut by the segment's end: its start decides
	if (huffman) {
		if (len >= 8 && !bpf_skb_load_bytes(skb, off, v, 8) && v[0] == HUFF_KUBE_PROBE)
			return 1;
		return len >= 11 && !bpf_skb_load_bytes(skb, off, v, 11) && v[0] == HUFF_SOCKSCALE_PROBE0 &&
		       v[1] == HUFF_SOCKSCALE_PROBE1;
	}
	if (len >= 11 && !bpf_skb_load_bytes(skb, off, v, 11) && v[0] == TOKEN8("kube-pro") &&
	    v[1] == TOKEN8("be/\0\0\0\0\0"))
		return 1;
	return len >= 16 && !bpf_skb_load_bytes(skb, off, v, 16) && v[0] == TOKEN8("sockscal") &&
	       v[1] == TOKEN8("e-probe/");
}

// hpack_step walks one field of the block; returns 1 to stop (the
// User-Agent found, or the block's bytes in this segment ended or made no
// sense). Runs under bpf_loop.
static long hpack_step(__u64 i, void *data)
{
	struct hpack_walk *w = data;
	__u32 off = w->off;
	__s64 index, len;
	__u8 b;

	if (off >= w->end || bpf_skb_load_bytes(w->skb, off, &b, 1))
		return 1;
	if (b & 0x80) { // an indexed field: no literal here
		return hpack_int(w->skb, &w->off, w->end, 7) < 0;
	}
	if ((b & 0xe0) == 0x20) { // a dynamic table size update
		return hpack_int(w->skb, &w->off, w->end, 5) < 0;
	}
	// A literal, with incremental indexing (01xxxxxx), without (0000xxxx)
	// or never indexed (0001xxxx): its name's index, 0 for a literal name.
	index = hpack_int(w->skb, &off, w->end, (b & 0xc0) == 0x40 ? 6 : 4);
	if (index < 0)
		return 1;
	if (index == 0) {
		len = hpack_int(w->skb, &off, w->end, 7);
		if (len < 0)
			return 1;
		off += len; // the name (a literal user-agent name is not looked for)
	}
	if (off >= w->end || bpf_skb_load_bytes(w->skb, off, &b, 1))
		return 1;
	len = hpack_int(w->skb, &off, w->end, 7);
	if (len < 0)
		return 1;
	if (index == HPACK_USER_AGENT) {
		w->probe = probe_agent(w->skb, off, w->end, len, b & 0x80);
		return 1; // the User-Agent decides
	}
	w->off = off + len;
	return 0;
}

// h2_probe_headers returns 1 if the HEADERS frame with flags whose payload
// starts at off, of len bytes of which those before end are in this
// segment, carries a health prober's User-Agent. A global function:
// verified once, whoever calls it.
__attribute__((noinline)) int h2_probe_headers(struct __sk_buff *skb, __u32 off, __u32 len, __u32 end, __u32 flags)
{
	struct hpack_walk w = {};
	__u8 pad = 0;

	if (!skb)
		return 0; // the verifier needs it; never
	if (flags & H2_FLAG_PADDED) {
		if (!len || bpf_skb_load_bytes(skb, off, &pad, 1))
			return 0;
		off++;
		len--;
		if (pad > len)
			return 0; // a framing error; the walk does not check padding
		len -= pad;
	}
	if (flags & H2_FLAG_PRIORITY) {
		if (len < 5)
			return 0;
		off += 5;
		len -= 5;
	}
	if (off >= end)
		return 0; // the block starts in a later segment
	w.skb = skb;
	w.off = off;
	w.end = end - off < len ? end : off + len;
	bpf_loop(HPACK_MAX_FIELDS, hpack_step, &w, 0);
	return w.probe;
}

#endif
