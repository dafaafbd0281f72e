// SPDX-License-Identifier: (MIT OR GPL-2.0)
// The response side: what egress does with server bytes it has not seen
// before. The message parser (message.h) finds where each response ends,
// which completes the oldest request in flight. A server that speaks first,
// or a first response that is not HTTP/1.x, makes the connection opaque;
// once a response was followed to its end, a parse failure only loses the
// stream, and the parser waits for a point where it can begin again
// (resync_response).

#ifndef SOCKSCALE_LIB_RESPONSE_H
#define SOCKSCALE_LIB_RESPONSE_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "../accounting.h"
#include "bytes.h"
#include "counters.h"
#include "maps.h"
#include "message.h"

// resync_response returns 1 if the response parser, which lost the stream,
// can begin again at the server bytes [off, end): they start with a status
// line ("HTTP/1.x ddd"), and the connection was idle in both directions
// before them: the client sent its newest request after the server's last
// bytes (tx_last_ns), so a client that does not pipeline had read every
// earlier response, which complete then. Sets the parser up at the status
// line.
static __always_inline int resync_response(struct __sk_buff *skb, struct conn *c, __u32 off, __u32 end)
{
	struct msg *m = &c->tx;
	__u64 line[2] = {};
	__u32 n = pending(c);
	__u8 d;
	int i;

	if (end - off < 13 || bpf_skb_load_bytes(skb, off, line, 13))
		return 0;
	if ((line[0] != TOKEN8("HTTP/1.1") && line[0] != TOKEN8("HTTP/1.0")) || (__u8)line[1] != ' ')
		return 0;
#pragma clang loop unroll(full)
	for (i = 1; i < 4; i++) {
		d = (__u8)(line[1] >> (8 * i)) - '0';
		if (d > 9)
			return 0;
	}
	if (n) {
		if ((n == 1 ? c->oldest_ns : c->start_ns[(c->pushed - 1) & RING_MASK]) <= c->tx_last_ns)
			return 0; // the server may still be answering an older request
		if (n > 1)
			pop_requests(counters_of(c), c, n - 1, c->tx_last_ns);
	}
	m->state = MS_START;
	m->hflags = 0;
	m->status = 0;
	token_reset(&m->pos, &m->hash);
	count_event(EV_RESYNC);
	return 1;
}

// on_response_bytes parses the server bytes [off, end), the new ones of a
// segment, and completes the requests whose responses ended in them (the
// pod's counters looked up where they count: see on_request_bytes).
static __always_inline void on_response_bytes(struct __sk_buff *skb, struct conn *c, __u32 off, __u32 end)
{
	struct msg *m = &c->tx;
	int err;

	if (c->opaque)
		return;
	// The clock is read only where something is counted: most segments of
	// a long response end nothing.
	if (!c->seen) {
		go_opaque(counters_of(c), c, bpf_ktime_get_ns()); // the server spoke first: not HTTP
		return;
	}
	if (m->state == MS_LOST && !resync_response(skb, c, off, end)) {
		c->tx_last_ns = bpf_ktime_get_ns();
		return;
	}
	err = parse_msg(skb, c, off, end, 0);
	if (err) {
		count_event(err == PARSE_ERROR ? EV_PARSE_ERROR : EV_PARSE_LIMIT);
		// Whether a connection is HTTP/1.x is decided at its start: by its
		// first response too.
		if (!c->answered) {
			go_opaque(counters_of(c), c, bpf_ktime_get_ns());
			return;
		}
		m->state = MS_LOST;
		c->tx_last_ns = bpf_ktime_get_ns();
	}
	if (m->state == MS_UNTIL_CLOSE && !c->tunnel)
		c->tunnel = 1; // for ingress, in the first cache line
	if (c->txs.done)
		pop_requests(counters_of(c), c, c->txs.done, bpf_ktime_get_ns());
}

#endif
