// SPDX-License-Identifier: (MIT OR GPL-2.0)
// The request side: a request starts with the first bytes a client sends on
// an idle connection, and the classifier here decides what it is: HTTP/1.x
// or not (opaque, counted at connection level), a health probe (not load)
// or load, HEAD or not (the response parser needs to know).

#ifndef SOCKSCALE_LIB_REQUEST_H
#define SOCKSCALE_LIB_REQUEST_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "../accounting.h"
#include "bytes.h"
#include "counters.h"

// method_word returns the length of the common method and its space that
// start the word w (4 for "GET " and "PUT ", 5 for "POST " and "HEAD "), or
// 0; *head says whether it is HEAD.
static __always_inline __u32 method_word(__u64 w, __u8 *head)
{
	*head = (w & PREFIX_MASK(5)) == TOKEN8("HEAD \0\0");
	if ((w & PREFIX_MASK(4)) == TOKEN8("GET \0\0\0") || (w & PREFIX_MASK(4)) == TOKEN8("PUT \0\0\0"))
		return 4;
	if (*head || (w & PREFIX_MASK(5)) == TOKEN8("POST \0\0"))
		return 5;
	return 0;
}

// scan_byte advances the request classifier by one byte. Returns 1 to stop
// bpf_loop once the verdict is known, or where the caller can go faster
// (the rest of a line to skip, the start of a line).
static long scan_byte(__u64 i, void *data)
{
	struct parse_ctx *s = data;
	struct conn *c = s->c;
	__u8 ch;

	// Byte i of the loop is byte skip+i of buf: the caller already
	// classified the first skip bytes (see scan_window).
	i += c->rx_skip;
	// The verifier needs i bounded to index buf; bpf_loop never passes more.
	if (i >= SCAN_WINDOW)
		return 1;
	ch = s->buf[i];
	c->rx_used = i + 1;

	switch (c->rx_state) {
	case RQ_METHOD:
		if (ch >= 'A' && ch <= 'Z') {
			if (c->rx_pos >= MAX_METHOD) {
				c->rx_verdict = VERDICT_OPAQUE;
				return 1;
			}
			token_add(&c->rx_pos, &c->rx_hash, ch);
			return 0;
		}
		// A method is at least three letters and a space. "PRI" starts the
		// HTTP/2 connection preface and is not an HTTP/1 method.
		if (ch != ' ' || c->rx_pos < 3 || (c->rx_pos == 3 && c->rx_hash == HASH_PRI)) {
			c->rx_verdict = VERDICT_OPAQUE;
			return 1;
		}
		c->head = c->rx_pos == 4 && c->rx_hash == HASH_HEAD;
		c->rx_state = c->load ? RQ_DONE : RQ_SKIP_LINE;
		return 1;
	case RQ_SKIP_LINE:
		if (ch == '\n') {
			c->rx_state = RQ_LINE_START;
			return 1;
		}
		return 0;
	case RQ_LINE_START:
		if (ch == '\r' || ch == '\n') {
			c->rx_state = RQ_DONE; // the headers ended: not a probe
			return 1;
		}
		c->rx_state = RQ_NAME;
		token_reset(&c->rx_pos, &c->rx_hash);
		// fall through: this byte is the name's first
	case RQ_NAME:
		if (ch == ':') {
			if (c->rx_pos == 10 && c->rx_hash == HASH_USER_AGENT) {
				c->rx_state = RQ_UA_SPACE;
				return 0;
			}
			c->rx_state = RQ_SKIP_LINE;
			return 1;
		}
		if (ch == '\n') {
			c->rx_state = RQ_LINE_START;
			return 1;
		}
		token_add(&c->rx_pos, &c->rx_hash, lower(ch));
		return 0;
	case RQ_UA_SPACE:
		if (ch == ' ' || ch == '\t')
			return 0;
		c->rx_state = RQ_UA_VALUE;
		token_reset(&c->rx_pos, &c->rx_hash);
		// fall through: this byte is the value's first
	case RQ_UA_VALUE:
		if (ch == '\r' || ch == '\n') {
			c->rx_state = RQ_DONE; // a short agent that is not a probe
			return 1;
		}
		token_add(&c->rx_pos, &c->rx_hash, ch);
		if ((c->rx_pos == 11 && c->rx_hash == HASH_KUBE_PROBE) || (c->rx_pos == 16 && c->rx_hash == HASH_SOCKSCALE_PROBE)) {
			c->rx_verdict = VERDICT_PROBE;
			return 1;
		}
		if (c->rx_pos >= 16) {
			c->rx_state = RQ_DONE; // another agent: load, and nothing else to learn
			return 1;
		}
		return 0;
	}
	return 1;
}

// scan_line_fast classifies the start of the line at buf[0] the way
// scan_byte would, without a parse step per byte: common methods and the
// User-Agent header and value are compared eight bytes at a time, and any
// other header name is skipped up to its colon. n bytes of buf are fresh.
// Returns the bytes consumed, or 0 to leave the line to scan_byte.
static __always_inline __u32 scan_line_fast(struct parse_ctx *s, __u32 n)
{
	struct conn *c = s->c;
	__u64 w0, w1, w2, w3, value0, value1;
	__u32 k;
	__u8 head;
	int q;

	if (n < 32)
		return 0; // fewer bytes than the words compared: scan_byte parses them
	w0 = word(s->buf, 0);
	if (c->rx_state == RQ_METHOD) {
		// Unlike scan_byte this does not hash the method: nothing reads
		// its token once the method is known.
		k = method_word(w0, &head);
		if (!k)
			return 0;
		c->head = head;
		c->rx_state = c->load ? RQ_DONE : RQ_SKIP_LINE;
		return k;
	}
	// RQ_LINE_START
	if ((__u8)w0 == '\r' || (__u8)w0 == '\n')
		return 0;
	w1 = word(s->buf, 1);
	if (lower8(w0) == TOKEN8("user-age") && (lower8(w1) & PREFIX_MASK(3)) == TOKEN8("nt:\0\0\0\0")) {
		c->rx_state = RQ_UA_SPACE;
		// "User-Agent: v..." with one space: the value's first 16 bytes,
		// buf[12, 28), decide it (scan_byte's RQ_UA_VALUE rules).
		if ((__u8)(w1 >> 24) != ' ')
			return 11;
		w2 = word(s->buf, 2);
		w3 = word(s->buf, 3);
		value0 = w1 >> 32 | w2 << 32;
		value1 = w2 >> 32 | w3 << 32;
		if ((__u8)value0 == ' ' || (__u8)value0 == '\t')
			return 11; // more spaces: scan_byte skips them
		if ((value0 == TOKEN8("kube-pro") && (value1 & PREFIX_MASK(3)) == TOKEN8("be/\0\0\0\0")) ||
		    (value0 == TOKEN8("sockscal") && value1 == TOKEN8("e-probe/")))
			c->rx_verdict = VERDICT_PROBE;
		else
			c->rx_state = RQ_DONE; // short or long, another agent is load
		return 28;
	}
	q = find_either(s->buf, 0, n, ':', '\n');
	if (q < 0)
		return 0; // a name longer than the window
	// A name that is not User-Agent: skip its line; or a line without a
	// colon, which scan_byte ends at its '\n' too. q < SCAN_WINDOW; the
	// mask says so to the verifier.
	c->rx_state = s->buf[q & (SCAN_WINDOW - 1)] == ':' ? RQ_SKIP_LINE : RQ_LINE_START;
	token_reset(&c->rx_pos, &c->rx_hash);
	return q + 1;
}

// scan_window loads the next window of request bytes and classifies them.
// It runs under bpf_loop, so the verifier checks it once rather than once
// per window; returns 1 when the scan is over.
static long scan_window(__u64 i, void *data)
{
	struct parse_ctx *s = data;
	struct conn *c = s->c;
	__u32 off = c->rx_off, n, k = 0;
	int lf;

	if (off >= c->rx_end || c->rx_state == RQ_DONE || c->rx_verdict != VERDICT_REQUEST)
		return 1;
	n = load_window(s, off, c->rx_end);
	if (!n)
		return 1;
	// A window starts at the parse position, so a line that starts it can
	// be classified in words; such a line ends the window when it is done.
	if ((c->rx_state == RQ_METHOD && c->rx_pos == 0) || c->rx_state == RQ_LINE_START) {
		k = scan_line_fast(s, n);
		if (c->rx_state == RQ_DONE || c->rx_verdict != VERDICT_REQUEST)
			return 1;
		if (k && c->rx_state == RQ_LINE_START)
			goto next;
	}
	if (c->rx_state != RQ_SKIP_LINE && k < n) {
		c->rx_skip = k;
		c->rx_used = n;
		bpf_loop(n - k, scan_byte, s, 0);
		k = c->rx_used;
	}
	if (c->rx_state == RQ_SKIP_LINE && k < n) {
		lf = find_lf(s->buf, k, n);
		if (lf >= 0) {
			c->rx_state = RQ_LINE_START;
			k = lf + 1;
		} else {
			k = n;
		}
	}
next:
	off += k;
	if (off > MAX_SEGMENT)
		return 1;
	c->rx_off = off;
	return 0;
}

// classify_request takes up to SCAN_STEPS windows over the bytes [off, end)
// that start a request: HTTP/1.x or not, a probe or load, HEAD or not; on a
// connection that already carried load, the method alone. Bytes beyond
// this segment are not looked at; an undecided scan is load.
static __always_inline __u8 classify_request(struct __sk_buff *skb, struct conn *c, __u32 off, __u32 end)
{
	struct parse_ctx s;

	s.skb = skb;
	s.c = c;
	c->rx_off = off;
	c->rx_end = end;
	c->rx_state = RQ_METHOD;
	c->rx_verdict = VERDICT_REQUEST;
	c->head = 0;
	token_reset(&c->rx_pos, &c->rx_hash);
	bpf_loop(SCAN_STEPS, scan_window, &s, 0);
	return c->rx_verdict;
}

// common_method reads the first eight bytes of a request and returns 1 if
// they start with a common method (GET, PUT, POST, HEAD), setting c->head
// as classify_request would; 0 leaves the request to classify_request. On
// a connection that carried load the method is all there is to learn, and
// this spares the scan's set-up and its 64-byte window.
static __always_inline int common_method(struct __sk_buff *skb, struct conn *c, __u32 off, __u32 end)
{
	__u64 w;
	__u8 head;

	if (end - off < 8 || bpf_skb_load_bytes(skb, off, &w, 8))
		return 0;
	if (!method_word(w, &head))
		return 0;
	if (c->head != head)
		c->head = head; // written on change only: egress reads its line
	return 1;
}

static __always_inline void on_request_bytes(struct __sk_buff *skb, struct pod_stats *pod, struct conn *c,
					     __u32 off, __u32 end)
{
	__u8 verdict;
	__u64 now;

	if (c->opaque)
		return;
	// Bytes while a request is in flight are its body (or a pipelined
	// request, which the request in flight covers).
	if (c->req != REQ_IDLE)
		return;
	if (!c->load || !common_method(skb, c, off, end))
		verdict = classify_request(skb, c, off, end);
	else
		verdict = VERDICT_REQUEST;
	if (!c->seen)
		c->seen = 1; // written once: ingress and egress share its line
	// Health probers do not keep connections alive (kubelet's disables
	// keep-alive, ours keeps a connection of its own), so once a request on
	// a connection was load, later requests on it are load too and only
	// their method is read. A connection that began with a probe is still
	// classified request by request.
	if (verdict == VERDICT_REQUEST && !c->load)
		c->load = 1;
	now = bpf_ktime_get_ns();
	if (verdict == VERDICT_OPAQUE) {
		go_opaque(pod, c, now);
		return;
	}
	start_request(pod, c, verdict == VERDICT_PROBE ? REQ_PROBE : REQ_BUSY, now);
}

#endif
