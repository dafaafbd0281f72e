// SPDX-License-Identifier: (MIT OR GPL-2.0)
// A new connection's state, made when it is accepted (sock_ops), from what
// ingress may have parsed of its first bytes before (the stash, conn.h).

#ifndef SOCKSCALE_LIB_ACCEPT_H
#define SOCKSCALE_LIB_ACCEPT_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "../accounting.h"
#include "conn.h"
#include "counters.h"
#include "maps.h"

// first_state returns the initial state of a connection of pod p (in
// slot) whose client and server send next rcv_nxt and snd_nxt: c, zeroed
// by the caller and filled here; or s, the stash entry of its first bytes,
// when they start at rcv_nxt. payload is how many bytes the segment that
// established it carried (sock_ops sees that, not the bytes).
static __always_inline struct conn *first_state(struct conn *c, struct conn *s, struct pod_stats *p, __u32 slot,
						__u8 proxied, __u32 rcv_nxt, __u32 snd_nxt, __u32 payload)
{
	struct conn *init = c;

	if (s && s->rx_first == rcv_nxt) {
		init = s; // what the stash parsed is the connection's start
	} else {
		c->rx_next = rcv_nxt;
		c->rx.hash = FNV_OFFSET; // the parsers start on an empty token
		c->tx.hash = FNV_OFFSET;
		if (s && (__s32)(s->rx_first - rcv_nxt) > 0) {
			// A later segment reached the listening socket: TCP keeps its
			// bytes until the hole before them fills (see note_gap).
			c->rx_gap = 1;
			c->gap_seq = s->rx_first;
			c->gap_end = s->rx_next;
		} else if (payload) {
			// Bytes no program saw (their stash entry was evicted): the
			// client spoke, and the parser starts lost (request_line_proof).
			c->rx_next = rcv_nxt + payload;
			c->seen = 1;
			c->rx.state = MS_LOST;
			count_event(EV_STREAM_GAP);
		}
	}
	init->pod_id = p->id;
	init->slot = slot;
	init->proxied = proxied;
	init->tx_next = snd_nxt;
	return init;
}

// count_accepted counts what a connection's first state holds, now that its
// pod is known: a connection, and the requests the stash parsed (with
// their start times) or its being opaque.
static __always_inline void count_accepted(struct pod_stats *p, struct conn *c)
{
	__u64 starts = 0, keep;
	__u32 i, slot, counted = 0, n = pending(c);

	__sync_fetch_and_add(&p->conns_in_flight, 1);
	__sync_fetch_and_add(&p->conns_total, 1);
	if (c->opaque) {
		__sync_fetch_and_add(&p->opaque_in_flight, 1);
		__sync_fetch_and_add(&p->opaque_total, 1);
	}
	if (!n)
		return;
	bpf_spin_lock(&p->lock);
#pragma clang loop unroll(disable)
	for (i = 0; i < MAX_PIPELINE; i++) {
		if (i >= n)
			break;
		slot = (c->popped + i) & RING_MASK;
		keep = ((c->probe_bits >> slot) & 1) - 1; // without branches (see push_locked)
		counted += keep & 1;
		starts += (i ? c->start_ns[slot] : c->oldest_ns) & keep; // the oldest's is not in the ring
	}
	p->all.in_flight += counted;
	p->all.started += counted;
	p->all.start_sum_ns += starts;
	if (c->proxied) {
		p->proxied.in_flight += counted;
		p->proxied.started += counted;
		p->proxied.start_sum_ns += starts;
	}
	bpf_spin_unlock(&p->lock);
	if (n > counted)
		__sync_fetch_and_add(&p->probes_total, n - counted);
}

#endif
