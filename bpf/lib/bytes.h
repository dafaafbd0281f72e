// SPDX-License-Identifier: (MIT OR GPL-2.0)
// What both parsers (request.h, response.h) read packet bytes with: the
// window of bytes copied from the packet (parse_ctx, load_window), tokens
// matched by length and FNV-1a hash (accounting.h has the hashes), and
// helpers over eight bytes at a time (word, TOKEN8, lower8, find_either).

#ifndef SOCKSCALE_LIB_BYTES_H
#define SOCKSCALE_LIB_BYTES_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "../accounting.h"

static __always_inline __u8 lower(__u8 ch)
{
	return (ch >= 'A' && ch <= 'Z') ? ch + ('a' - 'A') : ch;
}

// token_add appends ch to the token whose length and hash are *pos and *hash.
static __always_inline void token_add(__u8 *pos, __u32 *hash, __u8 ch)
{
	*hash = (*hash ^ ch) * FNV_PRIME;
	if (*pos < 255)
		*pos += 1;
}

static __always_inline void token_reset(__u8 *pos, __u32 *hash)
{
	*pos = 0;
	*hash = FNV_OFFSET;
}

// What the parse loops need besides the connection's own fields.
struct parse_ctx {
	// The window of packet bytes being parsed. Aligned so that whole words
	// can be read from it: the verifier refuses unaligned stack loads.
	__u8 buf[SCAN_WINDOW] __attribute__((aligned(8)));
	struct __sk_buff *skb; // the packet, for the window loads
	struct conn *c;        // parser state and scratch (see struct conn)
};

// load_window copies the packet bytes [off, min(end, off + SCAN_WINDOW))
// into buf. Returns how many (at least 1), or 0 if there are none or the
// load failed. The bytes of buf beyond that count are stale.
static __always_inline __u32 load_window(struct parse_ctx *s, __u32 off, __u32 end)
{
	__u32 n = end - off;

	// The bounds let the verifier check the variable-size load; off < end
	// is the caller's loop condition, so n == 0 only on a wrapped value.
	if (n > SCAN_WINDOW)
		n = SCAN_WINDOW;
	if (n < 1)
		return 0;
	if (bpf_skb_load_bytes(s->skb, off, s->buf, n))
		return 0;
	return n;
}

// word reads the eight bytes of buf at i*8 as a little-endian integer.
static __always_inline __u64 word(const __u8 *buf, int i)
{
	return *(const __u64 *)(buf + i * 8);
}

// TOKEN8 is the word of an 8-byte string literal, as word() reads it. Shorter
// tokens are padded with \0 and compared under PREFIX_MASK.
#define TOKEN8(s)                                                                                                   \
	((__u64)(s)[0] | (__u64)(s)[1] << 8 | (__u64)(s)[2] << 16 | (__u64)(s)[3] << 24 | (__u64)(s)[4] << 32 |   \
	 (__u64)(s)[5] << 40 | (__u64)(s)[6] << 48 | (__u64)(s)[7] << 56)
#define PREFIX_MASK(n) ((n) >= 8 ? ~0ULL : (1ULL << (8 * (n))) - 1) // the first n bytes of a word

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

// lower8 lowercases the ASCII letters among eight bytes at once: a byte gets
// 0x20 added where it is ASCII, >= 'A' and <= 'Z' (sums of its low seven bits
// carry into its top bit, never into the next byte).
static __always_inline __u64 lower8(__u64 x)
{
	__u64 low7 = x & ~HIGHS;
	__u64 ge_a = low7 + 0x3f * ONES;  // top bit set where byte >= 0x41 'A'
	__u64 gt_z = low7 + 0x25 * ONES;  // top bit set where byte >= 0x5b, past 'Z'
	__u64 upper = ge_a & ~gt_z & ~x & HIGHS;

	return x | (upper >> 2);
}

// find_either returns the index of the first byte of buf[start, n) that is
// a or b, or -1; eight bytes at a time, so a header line we do not care about
// costs a few instructions per word instead of a parse step per byte. A
// loop the compiler keeps rolled: this runs for every header line, and the
// unrolled code was kilobytes that the instruction cache had to hold.
static __always_inline int find_either(const __u8 *buf, __u32 start, __u32 n, __u8 a, __u8 b)
{
	__u32 w;

#pragma clang loop unroll(disable)
	for (w = start / 8; w < SCAN_WINDOW / 8; w++) {
		__u64 x, xa, xb, t, low;
		__u32 k, idx;

		if (n <= w * 8)
			return -1; // the rest of buf is stale
		idx = w * 8;
		// Keeps idx a plain offset from buf: a pointer the compiler steps
		// through the loop is one the verifier cannot bound.
		asm volatile("" : "+r"(idx));
		x = *(const __u64 *)(buf + idx);
		xa = x ^ (a * ONES); // a byte equal to a becomes zero
		xb = x ^ (b * ONES);
		// Bytes before start become 0xff: neither zero nor a borrow that
		// could flag the bytes above them.
		if (start > w * 8) {
			__u64 before = ~(~0ULL << ((start - w * 8) * 8));

			xa |= before;
			xb |= before;
		}
		// The lowest byte flagged in either is the first match: above a
		// zero byte the subtraction's borrow may flag more, never below.
		t = ((xa - ONES) & ~xa & HIGHS) | ((xb - ONES) & ~xb & HIGHS);
		if (!t)
			continue;
		low = t & -t; // bit 8k+7 for the first match at byte k
		k = 0;
		if (low >> 32) {
			k = 4;
			low >>= 32;
		}
		if (low >> 16) {
			k += 2;
			low >>= 16;
		}
		if (low >> 8)
			k += 1;
		if (w * 8 + k >= n)
			return -1; // a stale byte
		return w * 8 + k;
	}
	return -1;
}

static __always_inline int find_lf(const __u8 *buf, __u32 start, __u32 n)
{
	return find_either(buf, start, n, '\n', '\n');
}

#endif
