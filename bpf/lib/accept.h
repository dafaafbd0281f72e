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

// load_only makes every request of a connection load: its client is
// neither the node (the kubelet's probes) nor an activator (their
// prober's), so a probe's User-Agent is only what the client says it is,
// and a client that hid its load behind one could take a busy target to
// zero. What the stash classified as probes before the accept is load too.
static __always_inline void load_only(struct conn *c)
{
	c->load = 1;
	c->probe_bits = 0;
	c->rx.hflags &= ~HF_CLASSIFY;
}

// first_state returns the initial state of a connection of the pod in
// slot whose client and server send next rcv_nxt and snd_nxt: c, zeroed
// by the caller and filled here; or s, the stash entry of its first bytes,
// when they start at rcv_nxt. peer is the client's peer_kind; payload is
// how many bytes the segment that established it carried (sock_ops sees
// that, not the bytes).
static __always_inline struct conn *first_state(struct conn *c, struct conn *s, __u32 slot,
						__u8 peer, __u32 rcv_nxt, __u32 snd_nxt, __u32 payload)
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
	init->tenure = TENURE_NONE; // count_accepted sets it, under the lock
	init->slot = slot;
	init->proxied = (peer & PEER_ACTIVATOR) ? 1 : 0;
	init->tx_next = snd_nxt;
	if (!peer)
		load_only(init);
	return init;
}

// count_accepted counts what a connection's first state holds, now that its
// pod is known: a connection, and the requests the stash parsed (with
// their start times) or its being opaque. h is the HTTP/2 state walked
// before the accept (h2_accept_stash), whose streams in flight are the
// requests, their start times summed in it; NULL for any other connection
// (one that becomes HTTP/2 later counts as such then). p is the slot sock_ops found
// for the address pod_ip. Under its lock, if the slot is still the pod's
// at that address, the connection takes the slot's tenure (owner()) and
// counts: read outside the lock, the tenure could be that of another pod
// that took the slot since the lookup, whose counters the connection's
// requests then went to (TestKernelSlotReuseRace). Else it keeps
// TENURE_NONE and counts nowhere. Until then its segments may already
// have been parsed (its state is visible as soon as it is stored): they
// went into the ring under the same lock, counted by nobody, and are
// counted here. Ingress may adopt a connection (adopt.h) in the instant
// between TCP making it established and sock_ops' callback, which then
// finds the adopted state (creating socket storage returns what is there):
// the connection is counted once. Returns 1 if it counted.
static __always_inline int count_accepted(struct pod_stats *p, struct conn *c, struct h2_conn *h,
					  const struct ip_addr *pod_ip)
{
	__u64 starts = 0, keep;
	__u32 i, slot, counted = 0, n = pending(c);
	int ok = 0;

	bpf_spin_lock(&p->lock);
	if (!p->id || !ip_addr_eq(&p->ip, pod_ip) || c->closed || c->counted)
		goto out;
	c->counted = 1;
	c->tenure = p->tenure;
	ok = 1;
	p->conns_in_flight++;
	p->conns_total++;
	if (c->opaque) {
		p->opaque_in_flight++;
		p->opaque_total++;
	}
	if (h) {
		counted = n;
		starts = h->start_sum;
		p->probes_total += h->early_probes;
		if (!c->opaque) {
			p->h2_in_flight++;
			p->h2_total++;
		}
	} else {
#pragma clang loop unroll(disable)
		for (i = 0; i < MAX_PIPELINE; i++) {
			if (i >= n)
				break;
			slot = (c->popped + i) & RING_MASK;
			keep = ((c->probe_bits >> slot) & 1) - 1; // without branches (see push_locked)
			counted += keep & 1;
			starts += (i ? c->start_ns[slot] : c->oldest_ns) & keep; // the oldest's is not in the ring
		}
		p->probes_total += n - counted;
	}
	p->all.in_flight += counted;
	p->all.started += counted;
	p->all.start_sum_ns += starts;
	if (c->proxied) {
		p->proxied.in_flight += counted;
		p->proxied.started += counted;
		p->proxied.start_sum_ns += starts;
	}
out:
	bpf_spin_unlock(&p->lock);
	return ok;
}

#endif
