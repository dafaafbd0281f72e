// SPDX-License-Identifier: (MIT OR GPL-2.0)
// The HTTP/1.x message parser of both directions: requests (conn.rx, which
// ingress feeds) and responses (conn.tx, egress). It finds where every
// message ends: the start line, header lines (Content-Length,
// Transfer-Encoding, and User-Agent while a request is classified), then a
// body skipped by count, or chunks with their extensions and trailers. A
// request without a length has no body; a response without one lasts until
// the connection ends (RFC 9112 section 6.3). Each request takes a slot of
// the connection's ring (struct conn), so pipelined requests are counted
// one by one and each response is framed by its own request.
//
// Every function takes the direction as a constant (req: 1 for requests),
// so each direction compiles to code of its own without the other's
// branches.

#ifndef SOCKSCALE_LIB_MESSAGE_H
#define SOCKSCALE_LIB_MESSAGE_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "../accounting.h"
#include "bytes.h"
#include "counters.h"

// Why a parse stopped short (scan.err): the bytes are not HTTP/1.x, or a
// limit of the parser (steps per segment, requests in flight) was reached.
#define PARSE_ERROR (-1)
#define PARSE_LIMIT (-2)

static __always_inline struct msg *msg_of(struct conn *c, int req)
{
	return req ? &c->rx : &c->tx;
}

static __always_inline struct scan *scan_of(struct conn *c, int req)
{
	return req ? &c->rxs : &c->txs;
}

// ring_bit is the flag bit of request number n in head_bits and probe_bits.
static __always_inline __u16 ring_bit(__u32 n)
{
	return 1 << (n & RING_MASK);
}

// request_begin starts a request at its method's first byte: it takes
// the next number of the ring, and is counted once its headers are all in
// (headers_done), the point from which an HTTP server serves it: a client
// that sends its headers slowly holds no place in the count meanwhile.
// Returns 1 if the ring is full (more requests in flight than
// MAX_PIPELINE), which ends the parse with PARSE_LIMIT.
static __always_inline int request_begin(struct conn *c, struct msg *m, struct scan *sc)
{
	__u32 n = c->pushed + sc->done;
	__u16 bit = ring_bit(n);

	if (n - c->popped >= MAX_PIPELINE) {
		sc->err = PARSE_LIMIT;
		return 1;
	}
	// Written on change only: egress reads this cache line.
	if (c->head_bits & bit)
		c->head_bits &= ~bit;
	if (c->probe_bits & bit)
		c->probe_bits &= ~bit;
	m->hflags = c->load ? HF_BEGUN : HF_BEGUN | HF_CLASSIFY;
	return 0;
}

// request_counted ends a begun request's headers: it counts from the end
// of the segment being parsed (ingress pushes scan.done then).
static __always_inline void request_counted(struct msg *m, struct scan *sc)
{
	m->hflags &= ~HF_BEGUN;
	sc->done++;
}

// request_head marks the request being parsed (begun, not yet counted)
// HEAD: its response has no body.
static __always_inline void request_head(struct conn *c, struct scan *sc)
{
	c->head_bits |= ring_bit(c->pushed + sc->done);
}

// request_load ends the classification of the request being parsed: it is
// load, and so is every later request on the connection. Health probers do
// not keep connections alive for load (kubelet's disables keep-alive, ours
// keeps a connection of its own), so a connection that carried load is
// not classified again: its requests have only their method read.
static __always_inline void request_load(struct conn *c, struct msg *m)
{
	m->hflags &= ~HF_CLASSIFY;
	if (!c->load)
		c->load = 1;
}

// request_probe ends the classification of the request being parsed: a
// health probe, not load. The request is not counted before its headers
// end, so its flag is set in time however its bytes were cut.
static __always_inline void request_probe(struct conn *c, struct msg *m, struct scan *sc)
{
	m->hflags &= ~HF_CLASSIFY;
	c->probe_bits |= ring_bit(c->pushed + sc->done);
}

// message_done ends a message: the parser waits for the next start line. A
// response ends the oldest request in flight (egress counts it once the
// segment is parsed); a request was counted at its headers' end.
static __always_inline void message_done(struct conn *c, struct msg *m, struct scan *sc, int req)
{
	m->state = MS_START;
	m->hflags = 0;
	token_reset(&m->pos, &m->hash);
	if (req)
		return;
	sc->done++;
	m->status = 0;
	if (!c->answered)
		c->answered = 1; // written once: it shares the first cache line
}

// headers_done decides how the body is delimited (RFC 9112 section 6.3).
// Returns 1 when bpf_loop must stop: before body bytes, which the caller
// skips by count, and after a request, so that the next one starts a window.
static __always_inline long headers_done(struct conn *c, struct msg *m, struct scan *sc, int req)
{
	__u32 n;

	token_reset(&m->pos, &m->hash);
	if (req) {
		if (m->hflags & HF_CLASSIFY)
			request_load(c, m); // no probe's User-Agent
		request_counted(m, sc);
		if (m->hflags & HF_CHUNKED) {
			m->state = MS_CHUNK_SIZE;
			m->length = 0;
			return 0;
		}
		if ((m->hflags & HF_LENGTH) && m->length) {
			m->remaining = m->length;
			m->state = MS_BODY;
			return 1;
		}
		message_done(c, m, sc, req);
		return 1;
	}
	if (m->status >= 100 && m->status < 200 && m->status != 101) {
		m->state = MS_START; // interim (100 Continue): the final one follows
		m->hflags = 0;
		m->status = 0;
		return 0;
	}
	if (m->status == 101) {
		// Upgraded (websocket, h2c): one request for the connection's life.
		m->state = MS_UNTIL_CLOSE;
		return 1;
	}
	// The request this response answers: the oldest in flight not yet
	// answered in this segment.
	n = c->popped + sc->done;
	if (((__s32)(c->pushed - n) > 0 && (c->head_bits & ring_bit(n))) || m->status == 204 || m->status == 304) {
		message_done(c, m, sc, req);
		return 0;
	}
	if (m->hflags & HF_CHUNKED) {
		m->state = MS_CHUNK_SIZE;
		m->length = 0;
		return 0;
	}
	if (m->hflags & HF_LENGTH) {
		if (m->length == 0) {
			message_done(c, m, sc, req);
			return 0;
		}
		m->remaining = m->length;
		m->state = MS_BODY;
		return 1;
	}
	m->state = MS_UNTIL_CLOSE; // no length: the body ends with the connection
	return 1;
}

static __always_inline long chunk_size_done(struct msg *m, struct scan *sc)
{
	if (m->pos == 0) {
		sc->err = PARSE_ERROR; // a chunk-size line without digits
		return 1;
	}
	token_reset(&m->pos, &m->hash);
	if (m->length == 0) {
		m->state = MS_TRAILER_START; // last chunk: trailers, then CRLF
		return 0;
	}
	m->remaining = m->length;
	m->state = MS_CHUNK_DATA;
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
static __always_inline void te_token_end(struct msg *m)
{
	if (m->pos == 7 && m->hash == HASH_CHUNKED)
		m->hflags |= HF_CHUNKED;
	token_reset(&m->pos, &m->hash);
}

// msg_byte advances a parser by byte i of the window. Returns 1 to stop
// bpf_loop: on an error, before body bytes that the caller skips by count,
// or where the caller can go faster (the rest of a line to skip, the start
// of a header line, the next request).
static __always_inline long msg_byte(__u64 i, struct parse_ctx *r, int req)
{
	struct conn *c = r->c;
	struct msg *m = msg_of(c, req);
	struct scan *sc = scan_of(c, req);
	__u8 ch;
	int v;

	// Byte i of the loop is byte skip+i of buf: the caller already parsed
	// the first skip bytes (see msg_step).
	i += sc->skip;
	// The verifier needs i bounded to index buf; bpf_loop never passes more.
	if (i >= SCAN_WINDOW)
		return 1;
	ch = r->buf[i];
	sc->used = i + 1;

	switch (m->state) {
	case MS_START:
		if (req) {
			// A server ignores empty lines before a request line (RFC 9112
			// section 2.2); old clients send one after a POST body.
			if (ch == '\r' || ch == '\n')
				return 0;
			if (ch < 'A' || ch > 'Z')
				goto bad;
			if (request_begin(c, m, sc))
				return 1;
			token_reset(&m->pos, &m->hash);
			token_add(&m->pos, &m->hash, ch);
			m->state = MS_METHOD;
			return 0;
		}
		if (ch != ' ') {
			if (m->pos >= 8)
				goto bad; // "HTTP/1.1" is 8 bytes
			token_add(&m->pos, &m->hash, ch);
			if (m->pos == 5 && m->hash != HASH_HTTP_VERSION)
				goto bad;
			return 0;
		}
		if (m->pos < 6)
			goto bad;
		m->state = MS_CODE;
		m->status = 0;
		token_reset(&m->pos, &m->hash);
		return 0;
	case MS_METHOD:
		if (!req)
			goto bad; // requests only: spares the responses' code
		if (ch >= 'A' && ch <= 'Z') {
			if (m->pos >= MAX_METHOD)
				goto bad;
			token_add(&m->pos, &m->hash, ch);
			return 0;
		}
		// A method is at least three letters and a space. "PRI" starts the
		// HTTP/2 connection preface and is not an HTTP/1 method.
		if (ch != ' ' || m->pos < 3 || (m->pos == 3 && m->hash == HASH_PRI))
			goto bad;
		if (m->pos == 4 && m->hash == HASH_HEAD)
			request_head(c, sc);
		m->state = MS_SKIP_LINE;
		return 1; // the caller skips the rest of the request line word by word
	case MS_CODE:
		if (req)
			goto bad; // responses only
		if (ch >= '0' && ch <= '9' && m->pos < 3) {
			m->status = m->status * 10 + (ch - '0');
			m->pos++;
			return 0;
		}
		if (m->pos != 3)
			goto bad;
		if (ch == '\n') {
			m->state = MS_LINE_START;
			return 1;
		}
		m->state = MS_SKIP_LINE;
		return 1; // the caller skips the reason phrase word by word
	case MS_SKIP_LINE:
		if (ch == '\n') {
			m->state = MS_LINE_START;
			return 1;
		}
		return 0;
	case MS_LINE_START:
		if (ch == '\r') {
			m->state = MS_HEADERS_LF;
			return 0;
		}
		if (ch == '\n')
			return headers_done(c, m, sc, req);
		m->state = MS_NAME;
		token_reset(&m->pos, &m->hash);
		// fall through: this byte is the name's first
	case MS_NAME:
		if (ch == ':') {
			m->state = MS_SKIP_LINE;
			if (m->pos == 14 && m->hash == HASH_CONTENT_LENGTH) {
				m->state = MS_CL_VALUE;
				m->hflags |= HF_LENGTH;
				m->length = 0;
			} else if (m->pos == 17 && m->hash == HASH_TRANSFER_ENCODING) {
				m->state = MS_TE_VALUE;
			} else if (req && (m->hflags & HF_CLASSIFY) && m->pos == 10 && m->hash == HASH_USER_AGENT) {
				m->state = MS_UA_SPACE;
			}
			token_reset(&m->pos, &m->hash);
			// A header we do not care about: the caller skips its value
			// word by word.
			return m->state == MS_SKIP_LINE;
		}
		if (ch == '\n') {
			// A line without a colon is not a valid header; a line the
			// parser does not care about either way.
			m->state = MS_LINE_START;
			return 1;
		}
		token_add(&m->pos, &m->hash, lower(ch));
		return 0;
	case MS_UA_SPACE:
		if (!req)
			goto bad; // requests only
		if (ch == ' ' || ch == '\t')
			return 0;
		m->state = MS_UA_VALUE;
		token_reset(&m->pos, &m->hash);
		// fall through: this byte is the value's first
	case MS_UA_VALUE:
		if (!req)
			goto bad;
		if (ch == '\r' || ch == '\n') {
			request_load(c, m); // a short agent that is not a probe
			m->state = ch == '\n' ? MS_LINE_START : MS_SKIP_LINE;
			return 1;
		}
		token_add(&m->pos, &m->hash, ch);
		if ((m->pos == 11 && m->hash == HASH_KUBE_PROBE) || (m->pos == 16 && m->hash == HASH_SOCKSCALE_PROBE)) {
			request_probe(c, m, sc);
			m->state = MS_SKIP_LINE;
			return 1;
		}
		if (m->pos >= 16) {
			request_load(c, m); // another agent
			m->state = MS_SKIP_LINE;
			return 1;
		}
		return 0;
	case MS_CL_VALUE:
		if (ch >= '0' && ch <= '9') {
			if (m->pos >= 18)
				goto bad; // longer than any body we could count
			m->length = m->length * 10 + (ch - '0');
			m->pos++;
			return 0;
		}
		if (ch == ' ' || ch == '\t' || ch == '\r')
			return 0;
		if (ch == '\n' && m->pos > 0) {
			m->state = MS_LINE_START;
			return 1;
		}
		goto bad;
	case MS_TE_VALUE:
		// chunked must be among the codings (RFC 9112: the last one; a
		// sender of "chunked, gzip" is broken either way).
		if (ch == '\n') {
			te_token_end(m);
			m->state = MS_LINE_START;
			return 1;
		}
		if (ch == ',' || ch == ' ' || ch == '\t' || ch == '\r') {
			te_token_end(m);
			return 0;
		}
		token_add(&m->pos, &m->hash, lower(ch));
		return 0;
	case MS_HEADERS_LF:
		if (ch != '\n')
			goto bad;
		return headers_done(c, m, sc, req);
	case MS_CHUNK_SIZE:
		v = hex_value(ch);
		if (v >= 0) {
			if (m->pos >= 15)
				goto bad; // longer than any chunk we could count
			m->length = m->length * 16 + v;
			m->pos++;
			return 0;
		}
		if (ch == ';' || ch == ' ' || ch == '\t') {
			m->state = MS_CHUNK_EXT;
			return 0;
		}
		if (ch == '\r')
			return 0;
		if (ch == '\n')
			return chunk_size_done(m, sc);
		goto bad;
	case MS_CHUNK_EXT:
		if (ch == '\n')
			return chunk_size_done(m, sc);
		return 0;
	case MS_CHUNK_END:
		if (ch == '\r')
			return 0;
		if (ch != '\n')
			goto bad;
		m->state = MS_CHUNK_SIZE;
		m->length = 0;
		token_reset(&m->pos, &m->hash);
		return 0;
	case MS_TRAILER_START:
		if (ch == '\r') {
			m->state = MS_TRAILER_LF;
			return 0;
		}
		if (ch == '\n') {
			message_done(c, m, sc, req);
			return req; // after a request, the next one starts a window
		}
		m->state = MS_TRAILER_SKIP;
		return 1; // the caller skips the trailer word by word
	case MS_TRAILER_SKIP:
		if (ch == '\n')
			m->state = MS_TRAILER_START;
		return 0;
	case MS_TRAILER_LF:
		if (ch != '\n')
			goto bad;
		message_done(c, m, sc, req);
		return req;
	}
	// MS_BODY, MS_CHUNK_DATA, MS_UNTIL_CLOSE and MS_LOST are the caller's:
	// give the byte back.
	sc->used = i;
	return 1;
bad:
	sc->err = PARSE_ERROR;
	return 1;
}

static long request_byte(__u64 i, void *data)
{
	return msg_byte(i, data, 1);
}

static long response_byte(__u64 i, void *data)
{
	return msg_byte(i, data, 0);
}

// skip_body consumes body or chunk bytes by count. Returns 1 if it consumed
// the rest of the segment.
static __always_inline long skip_body(struct conn *c, struct msg *m, struct scan *sc, int req)
{
	__u32 avail = sc->end - sc->off;

	if (m->remaining > avail) {
		m->remaining -= avail;
		sc->off = sc->end;
		return 1;
	}
	sc->off += m->remaining;
	m->remaining = 0;
	if (m->state == MS_BODY)
		message_done(c, m, sc, req);
	else
		m->state = MS_CHUNK_END;
	return 0;
}

// content_length_fast parses a short Content-Length value the way msg_byte
// would: v holds the eight bytes after the colon, and a value of one space,
// one to five digits and CRLF ends within them (" 2\r\n"). Returns the
// bytes consumed, or 0 to leave the value to msg_byte.
static __always_inline __u32 content_length_fast(struct msg *m, __u64 v)
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
	m->length = length;
	m->pos = i - 1; // the digits, as msg_byte counts them
	m->state = MS_LINE_START;
	return i + 2;
}

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

// line_matters says whether the header line at buf[p] needs a look: the
// empty line, and lines that start like Content-Length, Transfer-Encoding
// and, while a request is classified, User-Agent. Other lines are skipped
// to their end. Without a branch: EQ is 1 where a ^ b is 0.
#define EQ(a, b) ((((__u64)((a) ^ (b))) - 1) >> 63)
static __always_inline __u64 line_matters(const struct parse_ctx *r, __u32 p, const struct msg *m, int req)
{
	__u8 ch = r->buf[p & (SCAN_WINDOW - 1)];
	__u8 low = ch | 0x20; // ASCII letters in lower case, and others that are no letters
	__u64 ua = req ? (m->hflags >> 2) & EQ(low, 'u') : 0; // HF_CLASSIFY

	_Static_assert(HF_CLASSIFY == 4, "the shift above");
	return EQ(ch, '\r') | EQ(ch, '\n') | EQ(low, 'c') | EQ(low, 't') | ua;
}

// line_fast parses the start of the line at buf[0] the way msg_byte would,
// without a parse step per byte: the empty line that ends the headers, a
// request's common methods, a status line of HTTP/1.1 or 1.0, the
// Content-Length (and a short value), Transfer-Encoding and User-Agent
// names (and a probe's agent) are compared eight bytes at a time, and any
// other header name is skipped up to its colon. n bytes of buf are fresh.
// Returns the bytes consumed, or 0 to leave the line to msg_byte.
static __always_inline __u32 line_fast(struct parse_ctx *r, struct conn *c, struct msg *m, struct scan *sc, __u32 n,
				       int req)
{
	__u64 w0, w1, w2, w3, value0, value1;
	__u8 d0, d1, d2, head;
	__u32 k;
	int q;

	w0 = word(r->buf, 0);
	// The empty line is often all that is left of the headers in a segment,
	// so it is looked at before the length checks below.
	if (m->state == MS_LINE_START && ((__u8)w0 == '\n' || (n >= 2 && (__u16)w0 == ('\r' | '\n' << 8)))) {
		headers_done(c, m, sc, req);
		return (__u8)w0 == '\n' ? 1 : 2;
	}
	if (req && m->state == MS_START) {
		if (n < 8)
			return 0; // fewer bytes than the word compared: msg_byte parses them
		k = method_word(w0, &head);
		if (!k || request_begin(c, m, sc))
			return 0;
		if (head)
			request_head(c, sc);
		token_reset(&m->pos, &m->hash); // nothing reads the method's token once it is known
		m->state = MS_SKIP_LINE;
		return k;
	}
	if (n < 24)
		return 0;
	w1 = word(r->buf, 1);
	if (m->state == MS_START) {
		// Responses: "HTTP/1.x ddd" then '\n' or the reason phrase.
		if ((w0 != TOKEN8("HTTP/1.1") && w0 != TOKEN8("HTTP/1.0")) || (__u8)w1 != ' ')
			return 0;
		d0 = (__u8)(w1 >> 8) - '0';
		d1 = (__u8)(w1 >> 16) - '0';
		d2 = (__u8)(w1 >> 24) - '0';
		if (d0 > 9 || d1 > 9 || d2 > 9)
			return 0; // msg_byte finds it bad
		// The token state msg_byte leaves after three digits.
		token_reset(&m->pos, &m->hash);
		m->pos = 3;
		m->status = d0 * 100 + d1 * 10 + d2;
		m->state = (__u8)(w1 >> 32) == '\n' ? MS_LINE_START : MS_SKIP_LINE;
		return 13;
	}
	// MS_LINE_START
	if ((__u8)w0 == '\r')
		return 0; // a CR without its LF: msg_byte finds it bad
	w2 = word(r->buf, 2);
	if (lower8(w0) == TOKEN8("content-") && (lower8(w1) & PREFIX_MASK(7)) == TOKEN8("length:\0")) {
		m->state = MS_CL_VALUE;
		m->hflags |= HF_LENGTH;
		m->length = 0;
		token_reset(&m->pos, &m->hash);
		return 15 + content_length_fast(m, w1 >> 56 | w2 << 8);
	}
	if (lower8(w0) == TOKEN8("transfer") && lower8(w1) == TOKEN8("-encodin") &&
	    (lower8(w2) & PREFIX_MASK(2)) == TOKEN8("g:\0\0\0\0\0\0")) {
		m->state = MS_TE_VALUE;
		token_reset(&m->pos, &m->hash);
		return 18;
	}
	if (req && (m->hflags & HF_CLASSIFY) && lower8(w0) == TOKEN8("user-age") &&
	    (lower8(w1) & PREFIX_MASK(3)) == TOKEN8("nt:\0\0\0\0")) {
		if (n < 32)
			return 0; // fewer bytes than the value's words: msg_byte parses them
		m->state = MS_UA_SPACE;
		token_reset(&m->pos, &m->hash);
		// "User-Agent: v..." with one space: the value's first 16 bytes,
		// buf[12, 28), decide it (msg_byte's MS_UA_VALUE rules).
		if ((__u8)(w1 >> 24) != ' ')
			return 11;
		w3 = word(r->buf, 3);
		value0 = w1 >> 32 | w2 << 32;
		value1 = w2 >> 32 | w3 << 32;
		if ((__u8)value0 == ' ' || (__u8)value0 == '\t')
			return 11; // more spaces: msg_byte skips them
		// Short or long, another agent is load. Either way the rest of
		// the line, from the value on, is skipped.
		if ((value0 == TOKEN8("kube-pro") && (value1 & PREFIX_MASK(3)) == TOKEN8("be/\0\0\0\0")) ||
		    (value0 == TOKEN8("sockscal") && value1 == TOKEN8("e-probe/")))
			request_probe(c, m, sc);
		else
			request_load(c, m);
		m->state = MS_SKIP_LINE;
		return 12;
	}
	q = find_either(r->buf, 0, n, ':', '\n');
	if (q < 0)
		return 0; // a name longer than the window
	// A name we do not care about: skip its line; or a line without a
	// colon, which msg_byte ends at its '\n' too. q < SCAN_WINDOW; the mask
	// says so to the verifier.
	m->state = r->buf[q & (SCAN_WINDOW - 1)] == ':' ? MS_SKIP_LINE : MS_LINE_START;
	token_reset(&m->pos, &m->hash);
	return q + 1;
}

// skip_lines skips the rest of the line at buf[k], which the parser does
// not care about (MS_SKIP_LINE), and the lines after it in the window that
// do not matter (line_matters): with every line end of the window in one
// word (lf_bitmap), a line costs a look at the byte after its end. It stops
// at the first line that matters: the empty line ends the headers here;
// any other is left at MS_LINE_START to the next window, which starts with
// it. Returns the bytes of buf consumed.
static __always_inline __u32 skip_lines(struct parse_ctx *r, struct conn *c, struct msg *m, struct scan *sc,
					__u32 k, __u32 n, int req)
{
	__u64 lfs, low;
	__u32 i, p = n;
	__u8 ch;

	if (k >= n || n > SCAN_WINDOW)
		return n; // always k < n <= SCAN_WINDOW; the shift below needs it
	lfs = lf_bitmap(r->buf, n) & (~0ULL << k);
	// A few lines a step: the verifier checks every iteration, and real
	// header lines are longer than a window's eighth. The loop only finds
	// where to stop, so that the verifier checks what follows once.
#pragma clang loop unroll(disable)
	for (i = 0; i < SKIP_LINES; i++) {
		if (!lfs) {
			p = 0; // still in the line to skip at the window's end
			break;
		}
		low = lfs & -lfs;
		lfs &= lfs - 1;
		p = bit_index(low) + 1; // the next line's first byte
		if (p >= n || line_matters(r, p, m, req))
			break;
		k = p;
	}
	if (!p)
		return n;
	if (p == k)
		return k; // SKIP_LINES lines: in the line that starts at k, which does not matter
	m->state = MS_LINE_START;
	if (p >= n)
		return n;
	ch = r->buf[p & (SCAN_WINDOW - 1)];
	if (ch == '\n') {
		headers_done(c, m, sc, req);
		return p + 1;
	}
	if (ch == '\r' && p + 1 < n && r->buf[(p + 1) & (SCAN_WINDOW - 1)] == '\n') {
		headers_done(c, m, sc, req);
		return p + 2;
	}
	return p;
}

// at_line_start says whether the parser is at the start of a line that
// line_fast can take.
static __always_inline int at_line_start(const struct msg *m, int req)
{
	if (m->state == MS_LINE_START)
		return 1;
	return m->state == MS_START && (req || m->pos == 0);
}

// msg_step takes one step over a segment's bytes: skips body bytes by
// count, or loads the window that starts at the parse position and parses
// it: the line that starts it in words where it can, then byte by byte,
// and lines it does not care about by searching for their ends. It runs
// under bpf_loop, so the verifier checks it once rather than once per
// step; returns 1 when the segment is done or the parse stopped.
static __always_inline long msg_step(struct parse_ctx *r, int req)
{
	struct conn *c = r->c;
	struct msg *m = msg_of(c, req);
	struct scan *sc = scan_of(c, req);
	__u32 off = sc->off, n, k = 0;
	int lf;

	if (off >= sc->end || sc->err || m->state == MS_UNTIL_CLOSE || m->state == MS_LOST)
		return 1;
	if (m->state == MS_BODY || m->state == MS_CHUNK_DATA)
		return skip_body(c, m, sc, req);
	n = load_window(r, off, sc->end);
	if (!n) {
		sc->err = PARSE_ERROR;
		return 1;
	}
	if (at_line_start(m, req)) {
		k = line_fast(r, c, m, sc, n, req);
		if (sc->err)
			return 1;
		if (k && m->state == MS_LINE_START && k < n && !line_matters(r, k, m, req))
			m->state = MS_SKIP_LINE; // the next line does not matter: skip it here
		else if (k && m->state != MS_SKIP_LINE && m->state != MS_CL_VALUE && m->state != MS_TE_VALUE &&
			 m->state != MS_UA_SPACE)
			goto next; // a new line, a body or the next message: it starts the next window
	}
	if (m->state != MS_SKIP_LINE && m->state != MS_TRAILER_SKIP && k < n) {
		sc->skip = k;
		sc->used = n;
		if (req)
			bpf_loop(n - k, request_byte, r, 0);
		else
			bpf_loop(n - k, response_byte, r, 0);
		k = sc->used;
		if (sc->err)
			return 1;
	}
	if (m->state == MS_SKIP_LINE && k < n) {
		k = skip_lines(r, c, m, sc, k, n, req);
	} else if (m->state == MS_TRAILER_SKIP && k < n) {
		lf = find_lf(r->buf, k, n);
		if (lf >= 0) {
			m->state = MS_TRAILER_START;
			k = lf + 1;
		} else {
			k = n;
		}
	}
next:
	sc->off = off + k;
	return sc->off >= sc->end; // done: spares bpf_loop a call that would say so
}

static long request_step(__u64 i, void *data)
{
	return msg_step(data, 1);
}

static long response_step(__u64 i, void *data)
{
	return msg_step(data, 0);
}

// parse_msg runs a direction's parser over the bytes [off, end) of the
// packet. Body and chunk bytes are skipped by count, so a message costs
// parse steps for its start line, headers and chunk-size lines only.
// Returns 0, PARSE_ERROR or PARSE_LIMIT; scan.done counts the requests
// whose headers ended or the responses completed.
static __always_inline int parse_msg(struct __sk_buff *skb, struct conn *c, __u32 off, __u32 end, int req)
{
	struct scan *sc = scan_of(c, req);
	struct msg *m = msg_of(c, req);
	struct parse_ctx r;

	r.skb = skb;
	r.c = c;
	sc->off = off;
	sc->end = end;
	sc->err = 0;
	sc->done = 0;
	if (req)
		bpf_loop(MAX_WINDOWS, request_step, &r, 0);
	else
		bpf_loop(MAX_WINDOWS, response_step, &r, 0);
	if (sc->err)
		return sc->err;
	if (sc->off < sc->end && m->state != MS_UNTIL_CLOSE)
		return PARSE_LIMIT;
	return 0;
}

#endif
