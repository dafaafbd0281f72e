// SPDX-License-Identifier: (MIT OR GPL-2.0)
// What both parsers (request.h, response.h) read packet bytes with: the
// window of bytes copied from the packet (parse_ctx, load_window), tokens
// matched by length and FNV-1a hash (accounting.h has the hashes), and
// helpers over eight bytes at a time (word, TOKEN8, lower8, eq_mask,
// find_either).

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
// Bytes go through __u8 first: a char above 0x7f is negative.
#define TOKEN8(s)                                                                                                   \
	((__u64)(__u8)(s)[0] | (__u64)(__u8)(s)[1] << 8 | (__u64)(__u8)(s)[2] << 16 | (__u64)(__u8)(s)[3] << 24 |     \
	 (__u64)(__u8)(s)[4] << 32 | (__u64)(__u8)(s)[5] << 40 | (__u64)(__u8)(s)[6] << 48 | (__u64)(__u8)(s)[7] << 56)
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

// eq_mask returns the top bit of every byte of x that is ch, and no other
// bits: exact, unlike the borrow trick of find_either, so that every match
// can be taken in turn (0x7f + 0x7f carries into no other byte).
static __always_inline __u64 eq_mask(__u64 x, __u8 ch)
{
	__u64 v = x ^ (ch * ONES);

	return ~(((v & ~HIGHS) + ~HIGHS) | v) & HIGHS;
}

// high_byte returns k for the word bit 8k+7, the one bit set in low.
static __always_inline __u32 high_byte(__u64 low)
{
	__u32 k = 0;

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
	return k;
}

// lf_bitmap returns bit i set for each byte buf[i] of buf[0, n) that is
// LF: every line end of the window in one word, without a branch. Each
// word's LFs (eq_mask: bits 8k+7) are gathered into a byte by a multiply
// whose partial products fall on distinct bits, the top byte's in order.
static __always_inline __u64 lf_bitmap(const __u8 *buf, __u32 n)
{
	__u64 bm = 0;
	int w;

	_Static_assert(SCAN_WINDOW == 64, "a bit of one word per byte of the window");
#pragma clang loop unroll(full)
	for (w = 0; w < SCAN_WINDOW / 8; w++)
		bm |= ((eq_mask(word(buf, w), '\n') >> 7) * 0x0102040810204080ULL) >> 56 << (8 * w);
	if (n < SCAN_WINDOW)
		bm &= (1ULL << n) - 1; // the rest of buf is stale
	return bm;
}

// bit_index returns i for the one bit set in low, 1 << i, without a branch.
static __always_inline __u32 bit_index(__u64 low)
{
	__u64 x = low - 1; // the i bits below it

	x = x - ((x >> 1) & 0x5555555555555555ULL);
	x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
	x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
	return (x * ONES) >> 56;
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
		k = high_byte(low);
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
