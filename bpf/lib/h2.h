// SPDX-License-Identifier: (MIT OR GPL-2.0)
// HTTP/2 with prior knowledge (h2c, gRPC): a stream is a request. It is in
// flight from the client's HEADERS frame that opens it to the server's
// frame that ends it (DATA or HEADERS with END_STREAM: gRPC ends a call
// with trailers), or to a RST_STREAM from either side, or to the server's
// GOAWAY for streams beyond its last, or to the connection's end. No
// header block is decoded: counting needs the frame headers only (9 bytes:
// length, type, flags, stream), and payloads are skipped by count.
//
// A connection is HTTP/2 when its client's first bytes are the connection
// preface (a server that writes its SETTINGS first, as gRPC servers may,
// is let through until they come), or from an HTTP/1.1 Upgrade to h2c on
// (h2_upgrade: the upgrading request is stream 1). Its frames are followed in struct
// h2_conn, kept beside struct conn only for such connections; frames it
// cannot follow (a framing error, more than MAX_H2_FRAMES in a segment,
// client bytes it never saw) make the connection opaque, counted at
// connection level from then on, as any connection that is not HTTP/1.x.
// Up to MAX_H2_STREAMS streams in flight are followed per connection; one
// opened beyond that is not counted (EV_H2_FULL): the count stays exact
// for those it follows, and never goes below zero or stays up.
//
// Health probes are not load: on a connection whose client may probe (the
// node, an activator), a stream whose HEADERS carry a prober's User-Agent
// (lib/hpack.h) is counted as a probe and not followed, until a stream of
// the connection is load; then every later one is, as for HTTP/1.

#ifndef SOCKSCALE_LIB_H2_H
#define SOCKSCALE_LIB_H2_H

#include <linux/bpf.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>

#include "../accounting.h"
#include "bytes.h"
#include "conn.h"
#include "counters.h"
#include "hpack.h"
#include "ip.h"
#include "maps.h"
#include "message.h"

#define H2_PREFACE_LEN 24 // "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#define H2_HEADER_LEN 9

// Frame types and flags that matter here (RFC 9113 section 6).
#define H2_DATA 0x0
#define H2_HEADERS 0x1
#define H2_PRIORITY 0x2
#define H2_RST_STREAM 0x3
#define H2_SETTINGS 0x4
#define H2_PUSH_PROMISE 0x5
#define H2_PING 0x6
#define H2_GOAWAY 0x7
#define H2_WINDOW_UPDATE 0x8
#define H2_CONTINUATION 0x9
#define H2_END_STREAM 0x1
#define H2_STASH_FRAMES 4 // frames after a preface that reached the listening socket (h2_stash_preface)

// The server side of a connection's HTTP/2 state: in the socket's storage,
// or by four-tuple in the test object (as conn.h keeps struct conn).
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC); // required for socket storage
	__type(key, int);                     // a socket
	__type(value, struct h2_conn);        // streams in flight and framing
} h2_store SEC(".maps");

// One zeroed struct h2_conn, what a connection's state starts from: it
// does not fit a packet program's stack.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);            // 0
	__type(value, struct h2_conn); // never written
} h2_zero SEC(".maps");

// The HTTP/2 state of connections whose client's first segment, the
// preface with a request, reached the listening socket before the accept
// (as the stash keeps their struct conn, lib/conn.h): their frames are
// walked there, and sock_ops moves the state into the connection's own
// socket when it is accepted (h2_accept_stash). LRU: an entry whose
// connection never comes is evicted.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_H2_STASHED);
	__type(key, struct conn_key);  // server side of the connection
	__type(value, struct h2_conn); // what ingress walked before the accept
} h2_stash SEC(".maps");

#ifdef SOCKSCALE_TEST_TUPLE
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_TEST_CONNS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct conn_key);  // server side of one TCP connection
	__type(value, struct h2_conn); // as h2_store's
} h2_conns SEC(".maps");

// h2_of returns the HTTP/2 state of the connection a segment belongs to,
// made (zeroed) if create and it has none; NULL if there is none (or no
// memory for it).
static __always_inline struct h2_conn *h2_of(struct __sk_buff *skb, const struct seg_ips *ip,
					     const struct tcphdr *tcp, int ingress, int create)
{
	struct conn_key key;
	struct h2_conn *zero;
	__u32 k = 0;

	segment_key(&key, ip, tcp, ingress);
	if (create) {
		zero = bpf_map_lookup_elem(&h2_zero, &k);
		if (zero)
			bpf_map_update_elem(&h2_conns, &key, zero, BPF_NOEXIST); // fails if it has one: kept
	}
	return bpf_map_lookup_elem(&h2_conns, &key);
}

// h2_keep stores h as the HTTP/2 state of the accepted connection key
// (sk: its socket, the production variant's) and returns it, or NULL.
static __always_inline struct h2_conn *h2_keep(struct bpf_sock *sk, struct conn_key *key, struct h2_conn *h)
{
	bpf_map_update_elem(&h2_conns, key, h, BPF_NOEXIST); // fails if it has one: kept
	return bpf_map_lookup_elem(&h2_conns, key);
}
#else
static __always_inline struct h2_conn *h2_of(struct __sk_buff *skb, const struct seg_ips *ip,
					     const struct tcphdr *tcp, int ingress, int create)
{
	struct bpf_sock *sk = skb->sk;
	struct h2_conn *zero;
	__u32 k = 0;

	if (!sk)
		return NULL;
	if (!create)
		return bpf_sk_storage_get(&h2_store, sk, 0, 0);
	zero = bpf_map_lookup_elem(&h2_zero, &k);
	if (!zero)
		return NULL; // an array of one: never
	return sk_storage_make(&h2_store, sk, zero);
}

static __always_inline struct h2_conn *h2_keep(struct bpf_sock *sk, struct conn_key *key, struct h2_conn *h)
{
	return sk_storage_make(&h2_store, sk, h);
}
#endif

// h2_stash_of returns fresh HTTP/2 state for the stash entry of a
// segment that reached the listening socket (made afresh, as the stash
// entry is: a segment sent again before the accept is walked again), or
// NULL without room.
static __always_inline struct h2_conn *h2_stash_of(const struct seg_ips *ip, const struct tcphdr *tcp)
{
	struct conn_key key;
	struct h2_conn *zero;
	__u32 k = 0;

	segment_key(&key, ip, tcp, 1);
	zero = bpf_map_lookup_elem(&h2_zero, &k);
	if (!zero || bpf_map_update_elem(&h2_stash, &key, zero, BPF_ANY))
		return NULL;
	return bpf_map_lookup_elem(&h2_stash, &key);
}

// h2_stash_find returns the HTTP/2 state walked so far for the stash
// entry of a segment that reached the listening socket, or NULL.
static __always_inline struct h2_conn *h2_stash_find(const struct seg_ips *ip, const struct tcphdr *tcp)
{
	struct conn_key key;

	segment_key(&key, ip, tcp, 1);
	return bpf_map_lookup_elem(&h2_stash, &key);
}

// h2_accept_stash moves the HTTP/2 state that ingress walked before the
// accept (c, the stash entry, says H2_FOLLOW) into the accepted
// connection's own (h2_keep) and returns it. Before the connection's
// state is stored: from then on its segments look for this one. Without
// it (evicted, or no memory) the streams' start times are lost: the
// connection is one request from now on, at connection level. key is the
// connection's; sk its socket.
static __always_inline struct h2_conn *h2_accept_stash(struct bpf_sock *sk, struct conn_key *key, struct conn *c)
{
	struct h2_conn *hs, *h = NULL;

	hs = bpf_map_lookup_elem(&h2_stash, key);
	if (hs) {
		h = h2_keep(sk, key, hs);
		bpf_map_delete_elem(&h2_stash, key);
	}
	if (h)
		return h;
	count_event(EV_H2_LOST);
	c->h2 = H2_NONE;
	c->opaque = 1;
	c->probe_bits = 0;
	c->popped = c->pushed;
	c->pushed++; // its one request, from the accept: close_conn ends it
	c->oldest_ns = bpf_ktime_get_ns();
	return NULL;
}

// h2_preface returns 1 if the bytes [off, end) start with the HTTP/2
// connection preface.
static __always_inline int h2_preface(struct __sk_buff *skb, __u32 off, __u32 end)
{
	__u64 p[3];

	if (end - off < H2_PREFACE_LEN || bpf_skb_load_bytes(skb, off, p, H2_PREFACE_LEN))
		return 0;
	return p[0] == TOKEN8("PRI * HT") && p[1] == TOKEN8("TP/2.0\r\n") && p[2] == TOKEN8("\r\nSM\r\n\r\n");
}

// h2_settings_first returns 1 if the bytes [off, end) start with what a
// server's connection preface is: a SETTINGS frame on stream 0, not an
// acknowledgement, of whole settings (6 bytes each).
static __always_inline int h2_settings_first(struct __sk_buff *skb, __u32 off, __u32 end)
{
	__u8 h[H2_HEADER_LEN];
	__u32 len;

	if (end - off < H2_HEADER_LEN || bpf_skb_load_bytes(skb, off, h, H2_HEADER_LEN))
		return 0;
	len = (__u32)h[0] << 16 | (__u32)h[1] << 8 | h[2];
	return h[3] == H2_SETTINGS && h[4] == 0 && !(h[5] | h[6] | h[7] | h[8]) && len % 6 == 0 && len <= 1024;
}

// h2_stash_preface returns 1 if the bytes [off, end), a client's first
// that reached the listening socket before the accept, are the connection
// preface followed by whole frames of the connection only (SETTINGS first,
// then SETTINGS, WINDOW_UPDATE or PING, up to H2_STASH_FRAMES): what Go's
// and grpc-go's clients write before their first request. They open no
// stream, so the walk can begin after them once the connection has its
// own socket (H2_STASHED); what else comes first goes the HTTP/1 way.
static __always_inline int h2_stash_preface(struct __sk_buff *skb, __u32 off, __u32 end)
{
	__u8 h[H2_HEADER_LEN];
	__u32 len, i;

	if (!h2_preface(skb, off, end))
		return 0;
	off += H2_PREFACE_LEN;
#pragma clang loop unroll(full)
	for (i = 0; i < H2_STASH_FRAMES; i++) {
		if (off == end)
			return 1;
		if (end - off < H2_HEADER_LEN || bpf_skb_load_bytes(skb, off, h, H2_HEADER_LEN))
			return 0;
		if (h[5] | h[6] | h[7] | h[8])
			return 0; // a stream's frame
		if (h[3] != H2_SETTINGS && (i == 0 || (h[3] != H2_WINDOW_UPDATE && h[3] != H2_PING)))
			return 0;
		len = (__u32)h[0] << 16 | (__u32)h[1] << 8 | h[2];
		if (len > end - off - H2_HEADER_LEN)
			return 0; // a frame the segment cuts
		off += H2_HEADER_LEN + len;
	}
	return off == end;
}

// What one direction's frame walk needs besides the maps.
struct h2_walk {
	struct __sk_buff *skb;
	struct conn *c;
	struct h2_conn *h;
	struct h2_dir *d; // the direction walked
	__u64 now;
	__u32 sid;    // the stream a table search looks for
	__u32 found;  // a table search's result: slot + 1, or 0
	__u32 opened; // streams opened in this segment
	__u32 probes; // health probes among the streams the client opened (not counted as load)
	// classify: the next new stream's User-Agent decides whether it is
	// load; paused: the walk stopped there, at a HEADERS frame of stream
	// p_sid, payload at p_off of p_len bytes, flags p_flags. (This order
	// of the fields verifies in half the steps of others.)
	__u8 classify;
	__u8 paused;
	__u32 p_sid, p_off, p_len, p_flags;
	__u32 closed; // streams ended in this segment ...
	__u64 starts; // ... and the sum of their start times
	int req;
};

// find_slot_step looks at one slot of the stream table for w->sid (0: a
// free slot). Runs under bpf_loop.
static long find_slot_step(__u64 i, void *data)
{
	struct h2_walk *w = data;

	if (i >= MAX_H2_STREAMS)
		return 1;
	if (w->h->ids[i & (MAX_H2_STREAMS - 1)] == w->sid) {
		w->found = i + 1;
		return 1;
	}
	return 0;
}

// find_slot returns the slot of stream sid in the table (sid 0: a free
// one), or -1.
static __always_inline int find_slot(struct h2_walk *w, __u32 sid)
{
	w->sid = sid;
	w->found = 0;
	bpf_loop(MAX_H2_STREAMS, find_slot_step, w, 0);
	return (int)w->found - 1;
}

_Static_assert((MAX_H2_STREAMS & (MAX_H2_STREAMS - 1)) == 0, "the table is indexed under a mask");

// end_stream ends stream sid if it is in flight: its slot is freed by
// whoever swaps its id out first (egress, or ingress at a client's
// RST_STREAM), who counts its end.
static __always_inline void end_stream(struct h2_walk *w, __u32 sid)
{
	int i = find_slot(w, sid);
	__u64 start;

	if (i < 0 || !sid)
		return; // not in flight (ended already, or never counted)
	i &= MAX_H2_STREAMS - 1;
	start = w->h->start_ns[i];
	if (__sync_val_compare_and_swap(&w->h->ids[i], sid, 0) != sid)
		return; // the other side ended it first
	w->closed++;
	w->starts += start;
}

// open_stream begins stream sid at w->now, in a free slot; without one it
// is not counted.
static __always_inline void open_stream(struct h2_walk *w, __u32 sid)
{
	int i = find_slot(w, 0);

	if (i < 0) {
		count_event(EV_H2_FULL);
		return;
	}
	i &= MAX_H2_STREAMS - 1;
	// The start time before the id: egress finds a stream by its id
	// (though it cannot end one before the server read it, after this).
	w->h->start_ns[i] = w->now;
	w->h->ids[i] = sid;
	w->opened++;
}

// goaway_step ends one slot's stream if it is beyond the last stream a
// server's GOAWAY said it processes (w->sid). Runs under bpf_loop.
static long goaway_step(__u64 i, void *data)
{
	struct h2_walk *w = data;
	__u32 sid, k = i & (MAX_H2_STREAMS - 1);
	__u64 start;

	if (i >= MAX_H2_STREAMS)
		return 1;
	sid = w->h->ids[k];
	if (sid <= w->sid)
		return 0;
	start = w->h->start_ns[k];
	if (__sync_val_compare_and_swap(&w->h->ids[k], sid, 0) == sid) {
		w->closed++;
		w->starts += start;
	}
	return 0;
}

// h2_frame acts on one frame header; returns 0, or PARSE_ERROR for a frame
// that breaks the framing rules (so the stream is not HTTP/2 as followed).
static __always_inline int h2_frame(struct h2_walk *w, const __u8 *hdr, __u32 payload_off, __u32 end)
{
	struct h2_dir *d = w->d;
	__u32 len, sid, last;
	__u8 type, flags;
	__u8 be[4];

	len = (__u32)hdr[0] << 16 | (__u32)hdr[1] << 8 | hdr[2];
	type = hdr[3];
	flags = hdr[4];
	sid = ((__u32)hdr[5] & 0x7f) << 24 | (__u32)hdr[6] << 16 | (__u32)hdr[7] << 8 | hdr[8];
	d->left = len;
	d->frames++;
	// The rules a stream of frames keeps (RFC 9113 section 6): which
	// frames belong to a stream and which to the connection. A stream of
	// bytes that is not HTTP/2, or a walk that lost its place, breaks one
	// of them within a few frames.
	switch (type) {
	case H2_DATA:
	case H2_HEADERS:
	case H2_PRIORITY:
	case H2_RST_STREAM:
	case H2_PUSH_PROMISE:
	case H2_CONTINUATION:
		if (!sid)
			return PARSE_ERROR;
		break;
	case H2_SETTINGS:
	case H2_PING:
	case H2_GOAWAY:
		if (sid)
			return PARSE_ERROR;
		break;
	}
	if (w->req && d->frames == 1 && type != H2_SETTINGS)
		return PARSE_ERROR; // the client's preface ends with its SETTINGS
	if (w->req) {
		if (type == H2_HEADERS && sid > w->h->max_stream) {
			if (!(sid & 1))
				return PARSE_ERROR; // a client opens odd streams only
			w->h->max_stream = sid;
			// A stream's User-Agent is looked at as HTTP/1's is (message.h):
			// on a connection from a prober's address, until one is load.
			// The walk stops for h2_bytes to look (outside bpf_loop).
			if (w->classify) {
				w->classify = 0;
				w->paused = 1;
				w->p_sid = sid;
				w->p_off = payload_off;
				w->p_len = len;
				w->p_flags = flags;
				return 0;
			}
			if (!w->c->load)
				w->c->load = 1; // a second new stream in the segment: load
			open_stream(w, sid);
		} else if (type == H2_RST_STREAM) {
			end_stream(w, sid);
		}
		return 0;
	}
	if (((type == H2_DATA || type == H2_HEADERS) && (flags & H2_END_STREAM)) || type == H2_RST_STREAM) {
		end_stream(w, sid);
	} else if (type == H2_GOAWAY && len >= 4 && payload_off + 4 <= end &&
		   !bpf_skb_load_bytes(w->skb, payload_off, be, 4)) {
		// Streams beyond the last one the server processes never get an
		// answer: the client retries them elsewhere.
		last = ((__u32)be[0] & 0x7f) << 24 | (__u32)be[1] << 16 | (__u32)be[2] << 8 | be[3];
		w->sid = last;
		bpf_loop(MAX_H2_STREAMS, goaway_step, w, 0);
	}
	return 0;
}

// skip_payload skips the current frame's payload bytes that the segment
// has, by count.
static __always_inline void skip_payload(struct h2_dir *d)
{
	__u32 n = d->end - d->off;

	if (n > d->left)
		n = d->left;
	d->left -= n;
	d->off += n;
}

// h2_step takes one step over a segment's bytes: reads the next frame
// header (whole, or the part of it the segment has, which the next
// completes), acts on it and skips its payload, or skips payload that
// began in an earlier segment. Runs under bpf_loop.
static long h2_step(__u64 i, void *data)
{
	struct h2_walk *w = data;
	struct h2_dir *d = w->d;
	__u32 off = d->off, end = d->end, k;
	__u8 hdr[H2_HEADER_LEN + 7] __attribute__((aligned(8)));
	__u8 ch;

	if (off >= end || d->err)
		return 1;
	if (d->left) {
		skip_payload(d);
		return 0;
	}
	if (!d->have && end - off >= H2_HEADER_LEN) {
		if (bpf_skb_load_bytes(w->skb, off, hdr, H2_HEADER_LEN)) {
			d->err = PARSE_ERROR;
			return 1;
		}
		d->off = off + H2_HEADER_LEN;
		d->err = h2_frame(w, hdr, d->off, end);
		if (d->err)
			return 1;
		skip_payload(d);
		return w->paused ? 1 : 0; // a callback returns 0 or 1, not a byte
	}
	// A header split over segments: its bytes one by one into d->hdr.
#pragma clang loop unroll(disable)
	for (k = 0; k < H2_HEADER_LEN; k++) {
		if (off >= end || d->have >= H2_HEADER_LEN)
			break;
		if (bpf_skb_load_bytes(w->skb, off, &ch, 1)) {
			d->err = PARSE_ERROR;
			return 1;
		}
		d->hdr[d->have & 15] = ch;
		d->have++;
		off++;
	}
	d->off = off;
	if (d->have < H2_HEADER_LEN)
		return 1; // the rest comes with the next segment
	d->have = 0;
	__builtin_memcpy(hdr, d->hdr, H2_HEADER_LEN + 7);
	d->err = h2_frame(w, hdr, off, end);
	if (d->err)
		return 1;
	skip_payload(d);
	return w->paused ? 1 : 0;
}

// h2_count applies a segment's stream changes to the pod's counters at
// w->now, unless the connection ended or went opaque meanwhile: opened
// streams are requests started, ended ones completed.
static __always_inline void h2_count(struct pod_stats *p, struct h2_walk *w)
{
	struct conn *c = w->c;
	struct h2_conn *h = w->h;
	__u64 opened = w->opened, closed = w->closed, now = w->now, took;
	int own;

	if (!p || (!opened && !closed && !w->probes))
		return;
	bpf_spin_lock(&p->lock);
	if (c->closed || c->opaque)
		goto out;
	own = owner(p, c);
	if (own)
		p->probes_total += w->probes;
	else if (!c->tenure)
		h->early_probes += w->probes; // a stash entry's: counted at the accept
	c->pushed += opened;
	c->popped += closed;
	h->start_sum += opened * now - w->starts;
	if (!own)
		goto out;
	took = closed * now - w->starts;
	p->all.in_flight += opened - closed;
	p->all.started += opened;
	p->all.completed += closed;
	p->all.start_sum_ns += opened * now - w->starts;
	p->all.done_sum_ns += took;
	if (c->proxied) {
		p->proxied.in_flight += opened - closed;
		p->proxied.started += opened;
		p->proxied.completed += closed;
		p->proxied.start_sum_ns += opened * now - w->starts;
		p->proxied.done_sum_ns += took;
	}
out:
	bpf_spin_unlock(&p->lock);
}

// h2_begin counts a connection that is followed as HTTP/2 from now on.
static __always_inline void h2_begin(struct pod_stats *p, struct conn *c)
{
	if (!p)
		return;
	bpf_spin_lock(&p->lock);
	if (!c->closed && !c->opaque && owner(p, c)) {
		p->h2_in_flight++;
		p->h2_total++;
	}
	bpf_spin_unlock(&p->lock);
}

// h2_from_stash begins following a connection whose client's preface came
// before the accept (H2_STASHED), at its first bytes after it; returns its
// HTTP/2 state, or NULL without memory for it (then it stays as it is,
// and its frames go the HTTP/1 way: connection level).
static __always_inline struct h2_conn *h2_from_stash(struct __sk_buff *skb, const struct seg_ips *ip,
						      const struct tcphdr *tcp, struct conn *c, int ingress)
{
	struct h2_conn *h = h2_of(skb, ip, tcp, ingress, 1);

	if (!h)
		return NULL;
	h->rx.frames = 1; // its SETTINGS came: the client's preface is done
	c->h2 = H2_FOLLOW;
	h2_begin(counters_of(c), c);
	return h;
}

// h2_upgraded returns 1 if the connection's last response was a 101
// (Switching Protocols) that nothing followed yet: HTTP/1.1's Upgrade,
// to h2c if the server's next bytes are its SETTINGS or the client's the
// preface (RFC 7540 section 3.2).
static __always_inline int h2_upgraded(struct conn *c)
{
	return c->tunnel && !c->h2 && !c->opaque && c->tx.status == 101 && c->tx.state == MS_UNTIL_CLOSE;
}

// h2_upgrade follows an HTTP/1.1 connection upgraded to h2c from now on
// (ingress: the client's preface came; egress: the server's SETTINGS):
// the upgrading request, in flight since it came, is stream 1, which the
// server answers as HTTP/2. Returns its HTTP/2 state, or NULL without
// memory for it (then it stays a tunnel: one request until it closes).
static __always_inline struct h2_conn *h2_upgrade(struct __sk_buff *skb, const struct seg_ips *ip,
						   const struct tcphdr *tcp, struct conn *c, int ingress)
{
	struct h2_conn *h = h2_of(skb, ip, tcp, ingress, 1);

	if (!h)
		return NULL;
	h->max_stream = 1;
	if (pending(c) == 1) {
		h->start_ns[0] = c->oldest_ns;
		h->start_sum = c->oldest_ns;
		h->ids[0] = 1;
	}
	c->h2 = ingress ? H2_FOLLOW : H2_UPGRADED;
	h2_begin(counters_of(c), c);
	return h;
}

// h2_go_opaque is go_opaque for a connection with HTTP/2 state whose
// frames could not be followed (or whose client turned out not to speak
// HTTP/2): its streams in flight end now, and it is one request in flight
// from now until it closes, its start time in h->start_sum (close_conn).
static __always_inline void h2_go_opaque(struct pod_stats *p, struct conn *c, struct h2_conn *h, __u64 now)
{
	__u64 n, sum;
	int own;

	count_event(EV_H2_LOST);
	if (!p)
		return;
	bpf_spin_lock(&p->lock);
	if (c->opaque || c->closed)
		goto out;
	own = owner(p, c);
	n = pending(c);
	sum = h->start_sum;
	c->popped = c->pushed;
	c->opaque = 1;
	c->pushed++; // the connection's one request: close_conn ends it
	h->start_sum = now;
	if (!own)
		goto out;
	p->all.in_flight += 1 - n;
	p->all.started += 1;
	p->all.completed += n;
	p->all.start_sum_ns += now - sum;
	p->all.done_sum_ns += n * now - sum;
	if (c->proxied) {
		p->proxied.in_flight += 1 - n;
		p->proxied.started += 1;
		p->proxied.completed += n;
		p->proxied.start_sum_ns += now - sum;
		p->proxied.done_sum_ns += n * now - sum;
	}
	p->opaque_in_flight++;
	p->opaque_total++;
	if (c->h2 == H2_FOLLOW)
		p->h2_in_flight--; // counted as opaque from now on
out:
	bpf_spin_unlock(&p->lock);
}

// h2_bytes walks the frames in the bytes [off, end) of one direction, and
// counts the streams they opened and ended.
static __always_inline void h2_bytes(struct __sk_buff *skb, struct conn *c, struct h2_conn *h, __u32 off, __u32 end,
				     int req)
{
	struct h2_walk w = {};

	if (c->opaque)
		return;
	w.skb = skb;
	w.c = c;
	w.h = h;
	w.d = req ? &h->rx : &h->tx;
	w.req = req;
	w.now = bpf_ktime_get_ns();
	w.d->off = off;
	w.d->end = end;
	w.d->err = 0;
	// On a connection that may carry probes, the first new stream of the
	// segment is looked at (one: each look costs a walk's verification).
	w.classify = req && !c->load;
	bpf_loop(MAX_H2_FRAMES, h2_step, &w, 0);
	if (w.paused) {
		w.paused = 0;
		w.classify = 0;
		if (h2_probe_headers(skb, w.p_off, w.p_len, end, w.p_flags)) {
			w.probes++; // not load, so not followed
		} else {
			if (!c->load)
				c->load = 1;
			open_stream(&w, w.p_sid);
		}
		bpf_loop(MAX_H2_FRAMES, h2_step, &w, 0); // the rest of the segment
	}
	if (!w.d->err && w.d->off < w.d->end)
		w.d->err = PARSE_LIMIT;
	// What the walk ended before a framing error still counts; then the
	// connection is one request from here.
	h2_count(counters_of(c), &w);
	if (w.d->err)
		h2_go_opaque(counters_of(c), c, h, w.now);
}

// h2_close_gap runs after the client bytes up to c->rx_next were walked
// (request.h's close_gap for HTTP/2): client bytes seen ahead of a hole
// that TCP has now filled are not seen again. Inside a payload they are
// skipped by count; else the walk lost its place.
static __always_inline void h2_close_gap(struct conn *c, struct h2_conn *h)
{
	__u32 missed;

	if ((__s32)(c->rx_next - c->gap_seq) < 0)
		return; // the hole is still open
	c->rx_gap = 0;
	if ((__s32)(c->gap_end - c->rx_next) <= 0)
		return; // this segment brought them again
	missed = c->gap_end - c->rx_next;
	c->rx_next = c->gap_end;
	if (c->opaque)
		return;
	if (!h->rx.have && h->rx.left >= missed) {
		h->rx.left -= missed;
		return;
	}
	h2_go_opaque(counters_of(c), c, h, bpf_ktime_get_ns());
}

// h2_request_bytes and h2_response_bytes walk one direction's new bytes.
// Global functions (see request_bytes): verified once, whatever called
// them. h is never NULL where they are called (the state lives as long as
// the socket); the verifier needs the check.
__attribute__((noinline)) int h2_request_bytes(struct __sk_buff *skb, struct conn *c, struct h2_conn *h, __u32 off,
					       __u32 end)
{
	if (!c || !h)
		return 0;
	h2_bytes(skb, c, h, off, end, 1);
	if (c->rx_gap)
		h2_close_gap(c, h);
	return 0;
}

__attribute__((noinline)) int h2_response_bytes(struct __sk_buff *skb, struct conn *c, struct h2_conn *h, __u32 off,
						__u32 end)
{
	if (!c || !h)
		return 0;
	h2_bytes(skb, c, h, off, end, 0);
	return 0;
}

#endif
