// SPDX-License-Identifier: (MIT OR GPL-2.0)
// The response side: an HTTP/1.x response parser that finds where each
// response ends (status line, Content-Length or chunked body, interim
// responses, HEAD, upgrades), which ends the request in flight.

#ifndef SOCKSCALE_LIB_RESPONSE_H
#define SOCKSCALE_LIB_RESPONSE_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "../accounting.h"
#include "bytes.h"
#include "counters.h"
#include "maps.h"

// Why parse_response gave up (conn.tx_err): the bytes are not HTTP/1.x, or
// the segment needed more than MAX_WINDOWS steps or is beyond MAX_SEGMENT.
#define PARSE_ERROR (-1)
#define PARSE_LIMIT (-2)

static __always_inline void response_done(struct conn *c)
{
	c->tx_done++;
	c->state = RS_STATUS;
	c->hflags = 0;
	c->status = 0;
	if (c->head)
		c->head = 0; // HEAD applies to the first response only
	token_reset(&c->pos, &c->hash);
}

// headers_done decides how the body is delimited (RFC 9112 section 6.3).
// Returns 1 when bpf_loop must stop so the caller skips body bytes by count.
static __always_inline long headers_done(struct conn *c)
{
	token_reset(&c->pos, &c->hash);
	if (c->status >= 100 && c->status < 200 && c->status != 101) {
		c->state = RS_STATUS; // interim (100 Continue): the final one follows
		c->hflags = 0;
		c->status = 0;
		return 0;
	}
	if (c->status == 101) {
		// Upgraded (websocket, h2c): one request for the connection's life.
		c->state = RS_UNTIL_CLOSE;
		return 1;
	}
	if (c->head || c->status == 204 || c->status == 304) {
		response_done(c);
		return 0;
	}
	if (c->hflags & HF_CHUNKED) {
		c->state = RS_CHUNK_SIZE;
		c->length = 0;
		return 0;
	}
	if (c->hflags & HF_LENGTH) {
		if (c->length == 0) {
			response_done(c);
			return 0;
		}
		c->remaining = c->length;
		c->state = RS_BODY;
		return 1;
	}
	c->state = RS_UNTIL_CLOSE; // no length: the body ends with the connection
	return 1;
}

static __always_inline long chunk_size_done(struct conn *c)
{
	if (c->pos == 0) {
		c->tx_err = PARSE_ERROR; // a chunk-size line without digits
		return 1;
	}
	token_reset(&c->pos, &c->hash);
	if (c->length == 0) {
		c->state = RS_TRAILER_START; // last chunk: trailers, then CRLF
		return 0;
	}
	c->remaining = c->length;
	c->state = RS_CHUNK_DATA;
	return 1;
}

static __always_inline int hex_value(__u8 ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	ch = lower(ch);
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	return -1;
}

// te_token_end notes a finished Transfer-Encoding token.
static __always_inline void te_token_end(struct conn *c)
{
	if (c->pos == 7 && c->hash == HASH_CHUNKED)
		c->hflags |= HF_CHUNKED;
	token_reset(&c->pos, &c->hash);
}

// response_byte advances the response parser by one byte. Returns 1 to stop
// bpf_loop: on an error, before body bytes that the caller skips by count,
// or where the caller can go faster (the rest of a line to skip, the start
// of a header line).
static long response_byte(__u64 i, void *data)
{
	struct parse_ctx *r = data;
	struct conn *c = r->c;
	__u8 ch;
	int v;

	// Byte i of the loop is byte skip+i of buf: the caller already parsed
	// the first skip bytes (see response_step).
	i += c->tx_skip;
	// The verifier needs i bounded to index buf; bpf_loop never passes more.
	if (i >= SCAN_WINDOW)
		return 1;
	ch = r->buf[i];
	c->tx_used = i + 1;

	switch (c->state) {
	case RS_STATUS:
		if (ch != ' ') {
			if (c->pos >= 8)
				goto bad; // "HTTP/1.1" is 8 bytes
			token_add(&c->pos, &c->hash, ch);
			if (c->pos == 5 && c->hash != HASH_HTTP_VERSION)
				goto bad;
			return 0;
		}
		if (c->pos < 6)
			goto bad;
		c->state = RS_CODE;
		c->status = 0;
		token_reset(&c->pos, &c->hash);
		return 0;
	case RS_CODE:
		if (ch >= '0' && ch <= '9' && c->pos < 3) {
			c->status = c->status * 10 + (ch - '0');
			c->pos++;
			return 0;
		}
		if (c->pos != 3)
			goto bad;
		if (ch == '\n') {
			c->state = RS_LINE_START;
			return 1;
		}
		c->state = RS_SKIP_LINE;
		return 1; // the caller skips the reason phrase word by word
	case RS_SKIP_LINE:
		if (ch == '\n') {
			c->state = RS_LINE_START;
			return 1;
		}
		return 0;
	case RS_LINE_START:
		if (ch == '\r') {
			c->state = RS_HEADERS_LF;
			return 0;
		}
		if (ch == '\n')
			return headers_done(c);
		c->state = RS_NAME;
		token_reset(&c->pos, &c->hash);
		// fall through: this byte is the name's first
	case RS_NAME:
		if (ch == ':') {
			c->state = RS_SKIP_LINE;
			if (c->pos == 14 && c->hash == HASH_CONTENT_LENGTH) {
				c->state = RS_CL_VALUE;
				c->hflags |= HF_LENGTH;
				c->length = 0;
			} else if (c->pos == 17 && c->hash == HASH_TRANSFER_ENCODING) {
				c->state = RS_TE_VALUE;
			}
			token_reset(&c->pos, &c->hash);
			// A header we do not care about: the caller skips its value
			// word by word.
			return c->state == RS_SKIP_LINE;
		}
		if (ch == '\n')
			goto bad; // a header line without a colon
		token_add(&c->pos, &c->hash, lower(ch));
		return 0;
	case RS_CL_VALUE:
		if (ch >= '0' && ch <= '9') {
			if (c->pos >= 18)
				goto bad; // longer than any body we could count
			c->length = c->length * 10 + (ch - '0');
			c->pos++;
			return 0;
		}
		if (ch == ' ' || ch == '\t' || ch == '\r')
			return 0;
		if (ch == '\n' && c->pos > 0) {
			c->state = RS_LINE_START;
			return 1;
		}
		goto bad;
	case RS_TE_VALUE:
		// chunked must be among the codings (RFC 9112: the last one; a
		// server that sends "chunked, gzip" is broken either way).
		if (ch == '\n') {
			te_token_end(c);
			c->state = RS_LINE_START;
			return 1;
		}
		if (ch == ',' || ch == ' ' || ch == '\t' || ch == '\r') {
			te_token_end(c);
			return 0;
		}
		token_add(&c->pos, &c->hash, lower(ch));
		return 0;
	case RS_HEADERS_LF:
		if (ch != '\n')
			goto bad;
		return headers_done(c);
	case RS_CHUNK_SIZE:
		v = hex_value(ch);
		if (v >= 0) {
			if (c->pos >= 15)
				goto bad; // longer than any chunk we could count
			c->length = c->length * 16 + v;
			c->pos++;
			return 0;
		}
		if (ch == ';' || ch == ' ' || ch == '\t') {
			c->state = RS_CHUNK_EXT;
			return 0;
		}
		if (ch == '\r')
			return 0;
		if (ch == '\n')
			return chunk_size_done(c);
		goto bad;
	case RS_CHUNK_EXT:
		if (ch == '\n')
			return chunk_size_done(c);
		return 0;
	case RS_CHUNK_END:
		if (ch == '\r')
			return 0;
		if (ch != '\n')
			goto bad;
		c->state = RS_CHUNK_SIZE;
		c->length = 0;
		token_reset(&c->pos, &c->hash);
		return 0;
	case RS_TRAILER_START:
		if (ch == '\r') {
			c->state = RS_TRAILER_LF;
			return 0;
		}
		if (ch == '\n') {
			response_done(c);
			return 0;
		}
		c->state = RS_TRAILER_SKIP;
		return 1; // the caller skips the trailer word by word
	case RS_TRAILER_SKIP:
		if (ch == '\n')
			c->state = RS_TRAILER_START;
		return 0;
	case RS_TRAILER_LF:
		if (ch != '\n')
			goto bad;
		response_done(c);
		return 0;
	}
	// RS_BODY, RS_CHUNK_DATA and RS_UNTIL_CLOSE are the caller's: give the
	// byte back.
	c->tx_used = i;
	return 1;
bad:
	c->tx_err = PARSE_ERROR;
	return 1;
}

// skip_body consumes body or chunk bytes by count. Returns 1 if it consumed
// the rest of the segment.
static __always_inline int skip_body(struct conn *c)
{
	__u32 avail = c->tx_end - c->tx_off;

	if (c->remaining > avail) {
		c->remaining -= avail;
		c->tx_off = c->tx_end;
		return 1;
	}
	c->tx_off += c->remaining;
	c->remaining = 0;
	if (c->state == RS_BODY)
		response_done(c);
	else
		c->state = RS_CHUNK_END;
	return 0;
}

// content_length_fast parses a short Content-Length value the way
// response_byte would: v holds the eight bytes after the colon, and a value
// of one space, one to five digits and CRLF ends within them (" 2\r\n").
// Returns the bytes consumed, or 0 to leave the value to response_byte.
static __always_inline __u32 content_length_fast(struct conn *c, __u64 v)
{
	__u64 length = 0;
	__u32 i;
	__u8 ch;

	if ((__u8)v != ' ')
		return 0;
#pragma clang loop unroll(full)
	for (i = 1; i < 6; i++) {
		ch = v >> (8 * i);
		if (ch < '0' || ch > '9')
			break;
		length = length * 10 + (ch - '0');
	}
	// i is the first byte after the digits: there must be some, then CRLF.
	if (i == 1 || (__u16)(v >> (8 * i)) != ('\r' | '\n' << 8))
		return 0;
	c->length = length;
	c->pos = i - 1; // the digits, as response_byte counts them
	c->state = RS_LINE_START;
	return i + 2;
}

// response_line_fast parses the start of the line at buf[0] the way
// response_byte would, without a parse step per byte: the empty line that
// ends the headers, a status line of HTTP/1.1 or 1.0, the Content-Length
// and Transfer-Encoding names (and a short Content-Length value) are
// compared eight bytes at a time, and any other header name is skipped up to
// its colon. n bytes of buf are fresh. Returns the bytes consumed, or 0 to
// leave the line to response_byte.
static __always_inline __u32 response_line_fast(struct parse_ctx *r, __u32 n)
{
	struct conn *c = r->c;
	__u64 w0, w1, w2;
	__u8 d0, d1, d2;
	int q;

	w0 = word(r->buf, 0);
	// The empty line is often all that is left of the headers in a segment,
	// so it is looked at before the length check below.
	if (c->state == RS_LINE_START && ((__u8)w0 == '\n' || (n >= 2 && (__u16)w0 == ('\r' | '\n' << 8)))) {
		headers_done(c);
		return (__u8)w0 == '\n' ? 1 : 2;
	}
	if (n < 24)
		return 0; // fewer bytes than the words compared: response_byte parses them
	w1 = word(r->buf, 1);
	if (c->state == RS_STATUS) {
		// "HTTP/1.x ddd" then '\n' or the reason phrase.
		if ((w0 != TOKEN8("HTTP/1.1") && w0 != TOKEN8("HTTP/1.0")) || (__u8)w1 != ' ')
			return 0;
		d0 = (__u8)(w1 >> 8) - '0';
		d1 = (__u8)(w1 >> 16) - '0';
		d2 = (__u8)(w1 >> 24) - '0';
		if (d0 > 9 || d1 > 9 || d2 > 9)
			return 0; // response_byte finds it bad
		// The token state response_byte leaves after three digits.
		token_reset(&c->pos, &c->hash);
		c->pos = 3;
		c->status = d0 * 100 + d1 * 10 + d2;
		c->state = (__u8)(w1 >> 32) == '\n' ? RS_LINE_START : RS_SKIP_LINE;
		return 13;
	}
	// RS_LINE_START
	if ((__u8)w0 == '\r')
		return 0; // a CR without its LF: response_byte finds it bad
	w2 = word(r->buf, 2);
	if (lower8(w0) == TOKEN8("content-") && (lower8(w1) & PREFIX_MASK(7)) == TOKEN8("length:\0")) {
		c->state = RS_CL_VALUE;
		c->hflags |= HF_LENGTH;
		c->length = 0;
		token_reset(&c->pos, &c->hash);
		return 15 + content_length_fast(c, w1 >> 56 | w2 << 8);
	}
	if (lower8(w0) == TOKEN8("transfer") && lower8(w1) == TOKEN8("-encodin") &&
	    (lower8(w2) & PREFIX_MASK(2)) == TOKEN8("g:\0\0\0\0\0\0")) {
		c->state = RS_TE_VALUE;
		token_reset(&c->pos, &c->hash);
		return 18;
	}
	q = find_either(r->buf, 0, n, ':', '\n');
	if (q < 0)
		return 0; // a name longer than the window
	// q < SCAN_WINDOW; the mask says so to the verifier.
	if (r->buf[q & (SCAN_WINDOW - 1)] == '\n') {
		c->tx_err = PARSE_ERROR; // a header line without a colon
		return 0;
	}
	c->state = RS_SKIP_LINE;
	token_reset(&c->pos, &c->hash);
	return q + 1;
}

// response_step takes one step over the response bytes: skips body bytes by
// count, or loads the window that starts at the parse position and parses
// it: the line that starts it in words where it can, then byte by byte, and
// lines it does not care about by searching for their end. It runs under
// bpf_loop, so the verifier checks it once rather than once per step;
// returns 1 when the segment is done or the parse failed.
static long response_step(__u64 i, void *data)
{
	struct parse_ctx *r = data;
	struct conn *c = r->c;
	__u32 off = c->tx_off, n, k = 0;
	int lf;

	if (off >= c->tx_end || c->state == RS_UNTIL_CLOSE || c->tx_err)
		return 1;
	if (c->state == RS_BODY || c->state == RS_CHUNK_DATA)
		return skip_body(c);
	n = load_window(r, off, c->tx_end);
	if (!n) {
		c->tx_err = PARSE_ERROR;
		return 1;
	}
	if ((c->state == RS_STATUS && c->pos == 0) || c->state == RS_LINE_START) {
		k = response_line_fast(r, n);
		if (c->tx_err)
			return 1;
		// Done with the line (a new line, a body, the next response): what
		// follows starts the next window. Otherwise the line goes on here.
		if (k && c->state != RS_SKIP_LINE && c->state != RS_CL_VALUE && c->state != RS_TE_VALUE)
			goto next;
	}
	if (c->state != RS_SKIP_LINE && c->state != RS_TRAILER_SKIP && k < n) {
		c->tx_skip = k;
		c->tx_used = n;
		bpf_loop(n - k, response_byte, r, 0);
		k = c->tx_used;
	}
	if ((c->state == RS_SKIP_LINE || c->state == RS_TRAILER_SKIP) && k < n) {
		lf = find_lf(r->buf, k, n);
		if (lf >= 0) {
			c->state = c->state == RS_SKIP_LINE ? RS_LINE_START : RS_TRAILER_START;
			k = lf + 1;
		} else {
			k = n;
		}
	}
next:
	off += k;
	if (off > MAX_SEGMENT) {
		c->tx_err = PARSE_LIMIT;
		return 1;
	}
	c->tx_off = off;
	return 0;
}

// parse_response runs the parser over the bytes [off, end) of the packet.
// Body and chunk bytes are skipped by count, so a response costs parse steps
// for its headers and chunk-size lines only. Returns 0, or PARSE_ERROR /
// PARSE_LIMIT when the connection must fall back to connection level.
static __always_inline int parse_response(struct __sk_buff *skb, struct conn *c, __u32 off, __u32 end)
{
	struct parse_ctx r;

	r.skb = skb;
	r.c = c;
	c->tx_off = off;
	c->tx_end = end;
	c->tx_err = 0;
	c->tx_done = 0;
	if (end > MAX_SEGMENT)
		return PARSE_LIMIT;
	bpf_loop(MAX_WINDOWS, response_step, &r, 0);
	if (c->tx_err)
		return c->tx_err;
	if (c->tx_off < c->tx_end && c->state != RS_UNTIL_CLOSE)
		return PARSE_LIMIT;
	return 0;
}

static __always_inline void on_response_bytes(struct __sk_buff *skb, struct pod_stats *pod, struct conn *c,
					      __u32 off, __u32 end)
{
	int err;

	if (c->opaque)
		return;
	// The clock is read only where something is counted: most segments of
	// a long response end nothing.
	if (!c->seen) {
		go_opaque(pod, c, bpf_ktime_get_ns()); // the server spoke first: not HTTP
		return;
	}
	err = parse_response(skb, c, off, end);
	if (err) {
		count_event(err == PARSE_ERROR ? EV_PARSE_ERROR : EV_PARSE_LIMIT);
		go_opaque(pod, c, bpf_ktime_get_ns());
		return;
	}
	if (c->tx_done)
		end_request(pod, c, bpf_ktime_get_ns());
}

#endif
