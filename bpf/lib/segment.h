// SPDX-License-Identifier: (MIT OR GPL-2.0)
// What both cgroup_skb programs do with a TCP segment: find the tracked
// connection it belongs to and hand the bytes it carries that were not seen
// before, in sequence order, to the request side (ingress) or the response
// side (egress). Ingress runs before TCP orders segments: bytes that come
// ahead of a hole are noted, and skipped once the hole fills (request.h).

#ifndef SOCKSCALE_LIB_SEGMENT_H
#define SOCKSCALE_LIB_SEGMENT_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "../accounting.h"
#include "adopt.h"
#include "conn.h"
#include "counters.h"
#include "h2.h"
#include "ip.h"
#include "request.h"
#include "response.h"

_Static_assert(sizeof(struct tcphdr) == HEADER_LEN, "TCP header size");

// request_bytes hands the client bytes [off, end), the new ones of a
// segment, to the request side, and then skips what was seen ahead of a
// hole it filled. A global function, which the verifier checks once by its
// arguments' types: ingress calls it with state in socket storage or in
// the stash, and inlined, the parse was checked once for each (twice the
// work). Returns 0.
__attribute__((noinline)) int request_bytes(struct __sk_buff *skb, struct conn *c, __u32 off, __u32 end)
{
	if (!c)
		return 0; // the verifier's rule for a global function's pointers
	on_request_bytes(skb, c, off, end);
	if (c->rx_gap && close_gap(c))
		push_requests(counters_of(c), c, 1, bpf_ktime_get_ns());
	return 0;
}

// untracked_conn returns the state for a client segment of a connection
// that has none: adopted if it is an established pod server connection
// (adopt.h), a stash entry if the segment reached a pod's listening socket
// (conn.h); else NULL.
static __always_inline struct conn *untracked_conn(struct __sk_buff *skb, const struct seg_ips *ip,
						   const struct tcphdr *tcp, __u32 seq, __u32 off)
{
	struct conn_key key;
	int adopted;

	segment_key(&key, ip, tcp, 1);
	adopted = adopt(skb, &key, seq, bpf_ntohl(tcp->ack_seq), off);
	if (adopted > 0)
		return conn_of(skb, ip, tcp, 1);
	if (adopted < 0)
		return NULL;
	return stash_conn(skb, ip, tcp, seq);
}

// A connection's client bytes are walked by one CPU at a time. Ingress
// runs before TCP takes the socket's lock, so two segments of one
// connection can be here at once on two CPUs: over veth or loopback a
// segment is received on the CPU that sent it, and an HTTP/2 client with
// many streams sends back to back from whichever CPU its writer runs on.
// Walked together, the two would share one parse state (struct scan,
// struct h2_dir) and lose frames without a sign. The second one waits for
// the first (a walk is a bounded program, so the wait is short) and then
// finds its bytes in order.
struct rx_claim {
	struct conn *c;
	int held;
};

// rx_claim_step tries once to take the connection's client side; the plain
// read first leaves the line shared while another CPU holds it. Runs under
// bpf_loop.
static long rx_claim_step(__u64 i, void *data)
{
	struct rx_claim *r = data;

	if (*(volatile __u32 *)&r->c->rx.walking)
		return 0;
	r->held = __sync_val_compare_and_swap(&r->c->rx.walking, 0, 1) == 0;
	return r->held;
}

// rx_take takes c's client side for this CPU's walk, waiting while
// another CPU walks it. The wait is bounded (MAX_RX_WAIT tries, far longer
// than any walk); past it the claim is taken over: a claim nobody will
// give back (a stash entry copied into its socket's storage at the accept
// while another CPU walked it, lib/accept.h) must not stall the
// connection for good.
static __always_inline void rx_take(struct conn *c)
{
	struct rx_claim r = {.c = c};

	if (__sync_val_compare_and_swap(&c->rx.walking, 0, 1) == 0)
		return;
	count_event(EV_RX_WAIT);
	bpf_loop(MAX_RX_WAIT, rx_claim_step, &r, 0);
	if (!r.held) {
		count_event(EV_RX_TAKEOVER);
		__sync_lock_test_and_set(&c->rx.walking, 1);
	}
}

// rx_give ends the walk rx_take began (an exchange: a full barrier, so the
// next walker sees every write of this one).
static __always_inline void rx_give(struct conn *c)
{
	__sync_lock_test_and_set(&c->rx.walking, 0);
}

// client_segment hands the client bytes of a segment that were not seen
// before to the request side, in sequence order (the walk of an HTTP/2
// connection's frames, or the HTTP/1 parser). Called with the connection's
// client side taken (rx_take).
static __always_inline void client_segment(struct __sk_buff *skb, const struct seg_ips *ip, const struct tcphdr *tcp,
					   struct conn *c, __u32 off, __u32 seq, __u32 end)
{
	struct h2_conn *h2 = NULL;
	__u32 next;

	next = c->rx_next;
	if ((__s32)(end - next) <= 0)
		return;
	if ((__s32)(seq - next) > 0) {
		note_gap(c, seq, end); // ahead of a hole: TCP keeps it until the hole fills
		return;
	}
	if ((__s32)(next - seq) > 0)
		off += next - seq;
	c->rx_next = end;
	// HTTP/2 with prior knowledge: its streams are followed (lib/h2.h).
	// Before the accept (a stash entry, tenure 0) the state has no socket
	// yet: a preface with the connection's frames only is noted, and the
	// walk begins with the bytes after it; one that came with a request
	// is walked into h2_stash, which the accept moves into the socket.
	// A stash entry goes on with a second segment that reached the
	// listener too (stash_conn): its frames are walked there as well.
	if (!c->tenure && !c->seen && !c->h2 && !c->opaque && h2_preface(skb, off, skb->len)) {
		c->seen = 1;
		if (h2_stash_preface(skb, off, skb->len)) {
			c->h2 = H2_STASHED;
			return;
		}
		h2 = h2_stash_of(ip, tcp);
		if (h2) {
			c->h2 = H2_FOLLOW;
			off += H2_PREFACE_LEN;
		} else {
			c->seen = 0; // no room: the HTTP/1 way, connection level
		}
	} else if (!c->tenure && c->h2 == H2_STASHED) {
		h2 = h2_stash_of(ip, tcp);
		if (!h2)
			return; // no room: h2_from_stash walks on from the next bytes, if it can
		h2->rx.frames = 1; // the client's SETTINGS came
		c->h2 = H2_FOLLOW;
	} else if (!c->tenure && c->h2 == H2_FOLLOW) {
		h2 = h2_stash_find(ip, tcp);
		if (!h2)
			return; // evicted: the accept finds none (h2_accept_stash)
	}
	if (!c->tenure && h2) {
		// load_only's rule (lib/accept.h), before the walk looks at a
		// User-Agent: only a client that may probe sends probes.
		if (!peer_kind(&ip->saddr))
			c->load = 1;
		h2_request_bytes(skb, c, h2, off, skb->len);
		return;
	}
	if (c->h2 == H2_STASHED && c->tenure)
		h2 = h2_from_stash(skb, ip, tcp, c, 1);
	// After an upgrade to h2c the client's next bytes are the preface.
	if ((c->h2 == H2_UPGRADED || h2_upgraded(c)) && h2_preface(skb, off, skb->len)) {
		h2 = c->h2 == H2_UPGRADED ? h2_of(skb, ip, tcp, 1, 0) : h2_upgrade(skb, ip, tcp, c, 1);
		if (h2) {
			c->h2 = H2_FOLLOW;
			off += H2_PREFACE_LEN;
		}
	} else if (c->h2 == H2_UPGRADED) {
		h2 = h2_of(skb, ip, tcp, 1, 0);
		if (h2)
			h2_go_opaque(counters_of(c), c, h2, bpf_ktime_get_ns()); // no HTTP/2 client after all
		return;
	}
	// The server's SETTINGS (egress, on another CPU) marked the connection
	// in the instant after its client's preface was followed: followed it is.
	if (c->h2 == H2_SERVER_FIRST && c->seen && !c->opaque)
		c->h2 = H2_FOLLOW;
	if (c->h2 != H2_FOLLOW && !c->seen && !c->opaque && c->tenure) {
		if (h2_preface(skb, off, skb->len)) {
			h2 = h2_of(skb, ip, tcp, 1, 1);
			if (h2) {
				c->seen = 1; // first: egress reads it before it marks H2_SERVER_FIRST
				c->h2 = H2_FOLLOW;
				off += H2_PREFACE_LEN;
				h2_begin(counters_of(c), c);
			}
		} else if (c->h2 == H2_SERVER_FIRST) {
			// The server spoke first, and the client is not HTTP/2: one
			// request for the connection's life, its start time where
			// close_conn looks for it on a connection with HTTP/2 state.
			h2 = h2_of(skb, ip, tcp, 1, 0);
			if (h2)
				h2_go_opaque(counters_of(c), c, h2, bpf_ktime_get_ns());
			return;
		}
	}
	if (c->h2 == H2_FOLLOW)
		h2_request_bytes(skb, c, h2 ? h2 : h2_of(skb, ip, tcp, 1, 0), off, skb->len);
	else
		request_bytes(skb, c, off, skb->len);
}

// on_segment finds the pod connection a segment belongs to and hands the
// bytes it has not seen before to the request or the response side.
static __always_inline int on_segment(struct __sk_buff *skb, int ingress)
{
	struct tcphdr tcp;
	struct seg_ips ip;
	__u32 off, len, seq, end, next;
	struct h2_conn *h2 = NULL;
	struct conn *c;

	off = load_ips(skb, &ip);
	if (!off)
		return 1; // not TCP over IPv4 or IPv6
	if (load_header(skb, off, &tcp))
		return 1;
	off += tcp.doff * 4;
	if (skb->len <= off) {
		// No payload: a pure ACK, SYN or FIN (half the packets). Only an
		// adopted or learned connection's end matters here (adopt.h).
		if (tcp.rst || (tcp.fin && !ingress)) {
			c = conn_of(skb, &ip, &tcp, ingress);
			if (c)
				end_adopted(c, c->h2 ? h2_of(skb, &ip, &tcp, ingress, 0) : NULL);
			else
				forget_learned_of(skb, ingress ? &ip.daddr : &ip.saddr);
		}
		return 1;
	}
	len = skb->len - off;
	seq = bpf_ntohl(tcp.seq) + tcp.syn; // a SYN's data (TCP Fast Open) follows its own number
	end = seq + len;
	c = conn_of(skb, &ip, &tcp, ingress);
	if (!c) {
		if (!ingress) {
			if (tcp.fin || tcp.rst)
				forget_learned_of(skb, &ip.saddr); // a learned connection's last bytes
			return 1;
		}
		c = untracked_conn(skb, &ip, &tcp, seq, off); // open before we were loaded, not yet accepted, or another's
		if (!c)
			return 1;
	}
	if (c->closed)
		return 1;
	// Once the agent removed the pod, the parse goes on so the connection's
	// state stays right, and owner() skips the counting.
	if (!ingress) {
		next = c->tx_next;
		if ((__s32)(end - next) <= 0)
			return 1; // every byte was seen before: a retransmission
		if ((__s32)(next - seq) > 0)
			off += next - seq; // a retransmission with new bytes at its end
		c->tx_next = end;
		if (c->h2 == H2_STASHED)
			h2 = h2_from_stash(skb, &ip, &tcp, c, 0);
		// A server that writes its HTTP/2 SETTINGS before the client's
		// preface came (lib/h2.h): its frames are walked while the
		// client's first bytes decide.
		if (!c->seen && !c->h2 && !c->opaque && c->tenure && h2_settings_first(skb, off, skb->len)) {
			h2 = h2_of(skb, &ip, &tcp, 0, 1);
			// Read again: the client's preface may have come meanwhile
			// (ingress, on another CPU), and its H2_FOLLOW stays.
			if (h2 && !c->seen && !c->h2)
				c->h2 = H2_SERVER_FIRST;
		}
		// An upgrade to h2c: the 101's next bytes are the server's SETTINGS,
		// in this segment or the 101's own.
		if (h2_upgraded(c) && h2_settings_first(skb, off, skb->len))
			h2 = h2_upgrade(skb, &ip, &tcp, c, 0);
		if (c->h2) {
			h2_response_bytes(skb, c, h2 ? h2 : h2_of(skb, &ip, &tcp, 0, 0), off, skb->len);
		} else {
			on_response_bytes(skb, c, off, skb->len);
			off = c->txs.off; // where the 101's headers ended, if they did
			if (h2_upgraded(c) && off < skb->len && h2_settings_first(skb, off, skb->len)) {
				h2 = h2_upgrade(skb, &ip, &tcp, c, 0);
				if (h2)
					h2_response_bytes(skb, c, h2, off, skb->len);
			}
		}
		if (c->adopted && (tcp.fin || tcp.rst))
			end_adopted(c, c->h2 ? h2_of(skb, &ip, &tcp, 0, 0) : NULL); // the last bytes of a server that closes
		return 1;
	}
	rx_take(c);
	client_segment(skb, &ip, &tcp, c, off, seq, end);
	rx_give(c);
	return 1;
}

#endif
