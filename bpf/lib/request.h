// SPDX-License-Identifier: (MIT OR GPL-2.0)
// The request side: what ingress does with client bytes it has not seen
// before. The message parser (message.h) follows the requests and begins
// one per request line; a request is counted from the end of the segment
// in which its headers end (the point from which a server serves it, and
// Knative's queue-proxy counts it), so a client that sends its headers
// slowly adds nothing to the load meanwhile. The first bytes of a connection
// decide whether it is HTTP/1.x at all (else it is opaque, counted at
// connection level); later the parser can lose the stream (bytes it never
// saw, a malformed request, one of its limits), and then it waits for a
// request line it can prove (request_line_proof) instead.

#ifndef SOCKSCALE_LIB_REQUEST_H
#define SOCKSCALE_LIB_REQUEST_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "../accounting.h"
#include "bytes.h"
#include "counters.h"
#include "maps.h"
#include "message.h"

// proof_step searches one window for the LF that ends a request line.
// Runs under bpf_loop; scan.used is the LF's packet offset once found.
static long proof_step(__u64 i, void *data)
{
	struct parse_ctx *s = data;
	struct scan *sc = &s->c->rxs;
	__u32 n;
	int lf;

	n = load_window(s, sc->off, sc->end);
	if (!n)
		return 1;
	lf = find_lf(s->buf, 0, n);
	if (lf >= 0) {
		sc->used = sc->off + lf;
		return 1;
	}
	sc->off += n;
	return 0;
}

// request_line_proof returns 1 if the bytes [off, end) start with a whole
// request line: a method of capitals and a space, then a line that ends
// with " HTTP/1.1" or " HTTP/1.0" and CRLF within PROOF_WINDOWS windows.
// Where a parser lost the stream, only such a line at the start of a
// segment lets it begin again.
static __always_inline int request_line_proof(struct __sk_buff *skb, struct conn *c, __u32 off, __u32 end)
{
	struct scan *sc = &c->rxs;
	struct parse_ctx s;
	__u32 n, i, method = 0;
	__u64 tail[2] = {};
	__u8 ch;

	s.skb = skb;
	s.c = c;
	n = load_window(&s, off, end);
	if (n < 16)
		return 0; // "GET / HTTP/1.1\r\n" is 16 bytes
#pragma clang loop unroll(full)
	for (i = 0; i <= MAX_METHOD; i++) {
		ch = s.buf[i];
		if (i >= n || ch < 'A' || ch > 'Z')
			break;
		method++;
	}
	if (method < 3 || method >= n || s.buf[method & (SCAN_WINDOW - 1)] != ' ' ||
	    (method == 3 && (word(s.buf, 0) & PREFIX_MASK(4)) == TOKEN8("PRI \0\0\0\0")))
		return 0;
	sc->off = off;
	sc->end = end;
	sc->used = 0;
	bpf_loop(PROOF_WINDOWS, proof_step, &s, 0);
	// The LF, the version before it and at least one byte of target.
	if (!sc->used || sc->used < off + method + 11)
		return 0;
	if (bpf_skb_load_bytes(skb, sc->used - 10, tail, 11))
		return 0;
	return tail[0] == TOKEN8(" HTTP/1.") && ((tail[1] & 0xffffff) == ('1' | '\r' << 8 | '\n' << 16) ||
						 (tail[1] & 0xffffff) == ('0' | '\r' << 8 | '\n' << 16));
}

// on_request_bytes parses the client bytes [off, end), the new ones of a
// segment in sequence order, and counts the requests begun in them. The
// pod's counters are looked up (an array index) only where they count, so
// that the verifier checks the parse once, not once per state of the
// pointer.
static __always_inline void on_request_bytes(struct __sk_buff *skb, struct conn *c, __u32 off, __u32 end)
{
	struct scan *sc = &c->rxs;
	struct msg *m = &c->rx;
	__u32 begun;
	int err;

	// After an upgrade (101) the client's bytes are not HTTP/1.x any more.
	if (c->opaque || c->tunnel)
		return;
	if (m->state == MS_LOST) {
		// A request line proves where a request starts once no request is
		// in flight (a client that does not pipeline sends the next one
		// after the response), or where the response parser is lost too
		// and waits for this one.
		if ((pending(c) && c->tx.state != MS_LOST) || !request_line_proof(skb, c, off, end))
			return;
		m->state = MS_START;
		m->hflags = 0;
		token_reset(&m->pos, &m->hash);
		count_event(EV_RESYNC);
	}
	err = parse_msg(skb, c, off, end, 1);
	if (!c->seen)
		c->seen = 1; // written once: ingress and egress share its line
	if (err) {
		begun = (m->hflags & HF_BEGUN) ? 1 : 0;
		// Whether a connection is HTTP/1.x is decided by its first request:
		// bytes that are no request there (TLS, h2) make it opaque, which
		// is no parse error.
		if (!c->answered && c->pushed + sc->done + begun <= 1) {
			go_opaque(counters_of(c), c, bpf_ktime_get_ns());
			return;
		}
		count_event(err == PARSE_ERROR ? EV_PARSE_ERROR : EV_PARSE_LIMIT);
		m->state = MS_LOST;
		// A request whose headers the parser could not follow to their end
		// (it had a method) is a request all the same: it counts from here.
		if (begun)
			request_counted(m, sc);
	}
	if (sc->done)
		push_requests(counters_of(c), c, sc->done, bpf_ktime_get_ns());
}

// note_gap remembers client bytes [seq, end) that arrived ahead of a hole:
// ingress runs before TCP puts segments in order, and TCP holds these until
// the hole is filled, when ingress does not see them again.
static __always_inline void note_gap(struct conn *c, __u32 seq, __u32 end)
{
	if (!c->rx_gap) {
		c->gap_seq = seq;
		c->gap_end = end;
		c->rx_gap = 1;
		return;
	}
	if ((__s32)(seq - c->gap_seq) < 0)
		c->gap_seq = seq;
	if ((__s32)(end - c->gap_end) > 0)
		c->gap_end = end;
}

// close_gap runs after the client bytes up to c->rx_next were parsed. Once
// they reach the bytes seen ahead of the hole, those will not be seen again
// (TCP delivers them from its queue): the parser skips them by count where
// they are body or chunk bytes, and else has lost the stream. Bytes beyond
// a second hole are counted as missed too (only the outermost range is
// kept), which can only lose the stream, never misplace it. Returns 1 if
// it lost the stream in the headers of a begun request, which then counts
// (as in on_request_bytes).
static __always_inline __u32 close_gap(struct conn *c)
{
	struct msg *m = &c->rx;
	__u32 missed;

	if ((__s32)(c->rx_next - c->gap_seq) < 0)
		return 0; // the hole is still open
	c->rx_gap = 0;
	if ((__s32)(c->gap_end - c->rx_next) <= 0)
		return 0; // this segment brought them again
	missed = c->gap_end - c->rx_next;
	c->rx_next = c->gap_end;
	if (c->opaque || m->state == MS_LOST || c->tunnel)
		return 0;
	if ((m->state == MS_BODY || m->state == MS_CHUNK_DATA) && m->remaining >= missed) {
		m->remaining -= missed;
		if (m->remaining)
			return 0;
		if (m->state == MS_CHUNK_DATA) {
			m->state = MS_CHUNK_END;
			return 0;
		}
		message_done(c, m, &c->rxs, 1); // the request ended with them
		return 0;
	}
	m->state = MS_LOST;
	count_event(EV_STREAM_GAP);
	if (!(m->hflags & HF_BEGUN))
		return 0;
	m->hflags &= ~HF_BEGUN;
	return 1;
}

#endif
