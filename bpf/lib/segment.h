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
	next = c->rx_next;
	if ((__s32)(end - next) <= 0)
		return 1;
	if ((__s32)(seq - next) > 0) {
		note_gap(c, seq, end); // ahead of a hole: TCP keeps it until the hole fills
		return 1;
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
			return 1;
		}
		h2 = h2_stash_of(&ip, &tcp);
		if (h2) {
			c->h2 = H2_FOLLOW;
			off += H2_PREFACE_LEN;
		} else {
			c->seen = 0; // no room: the HTTP/1 way, connection level
		}
	} else if (!c->tenure && c->h2 == H2_STASHED) {
		h2 = h2_stash_of(&ip, &tcp);
		if (!h2)
			return 1; // no room: h2_from_stash walks on from the next bytes, if it can
		h2->rx.frames = 1; // the client's SETTINGS came
		c->h2 = H2_FOLLOW;
	} else if (!c->tenure && c->h2 == H2_FOLLOW) {
		h2 = h2_stash_find(&ip, &tcp);
		if (!h2)
			return 1; // evicted: the accept finds none (h2_accept_stash)
	}
	if (!c->tenure && h2) {
		// load_only's rule (lib/accept.h), before the walk looks at a
		// User-Agent: only a client that may probe sends probes.
		if (!peer_kind(&ip.saddr))
			c->load = 1;
		h2_request_bytes(skb, c, h2, off, skb->len);
		return 1;
	}
	if (c->h2 == H2_STASHED && c->tenure)
		h2 = h2_from_stash(skb, &ip, &tcp, c, 1);
	// After an upgrade to h2c the client's next bytes are the preface.
	if ((c->h2 == H2_UPGRADED || h2_upgraded(c)) && h2_preface(skb, off, skb->len)) {
		h2 = c->h2 == H2_UPGRADED ? h2_of(skb, &ip, &tcp, 1, 0) : h2_upgrade(skb, &ip, &tcp, c, 1);
		if (h2) {
			c->h2 = H2_FOLLOW;
			off += H2_PREFACE_LEN;
		}
	} else if (c->h2 == H2_UPGRADED) {
		h2 = h2_of(skb, &ip, &tcp, 1, 0);
		if (h2)
			h2_go_opaque(counters_of(c), c, h2, bpf_ktime_get_ns()); // no HTTP/2 client after all
		return 1;
	}
	// The server's SETTINGS (egress, on another CPU) marked the connection
	// in the instant after its client's preface was followed: followed it is.
	if (c->h2 == H2_SERVER_FIRST && c->seen && !c->opaque)
		c->h2 = H2_FOLLOW;
	if (c->h2 != H2_FOLLOW && !c->seen && !c->opaque && c->tenure) {
		if (h2_preface(skb, off, skb->len)) {
			h2 = h2_of(skb, &ip, &tcp, 1, 1);
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
			h2 = h2_of(skb, &ip, &tcp, 1, 0);
			if (h2)
				h2_go_opaque(counters_of(c), c, h2, bpf_ktime_get_ns());
			return 1;
		}
	}
	if (c->h2 == H2_FOLLOW)
		h2_request_bytes(skb, c, h2 ? h2 : h2_of(skb, &ip, &tcp, 1, 0), off, skb->len);
	else
		request_bytes(skb, c, off, skb->len);
	return 1;
}

#endif
