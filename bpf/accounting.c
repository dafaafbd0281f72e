// SPDX-License-Identifier: (MIT OR GPL-2.0)
//go:build ignore

// In-kernel request accounting for sockscale.
//
// Three programs attach once at a cgroup v2 root and so see the TCP sockets
// of every pod below it:
//
//   sockops          accepts and closes: creates and ends per-connection state
//   cgroup_skb/in    bytes from clients: a request starts with its first bytes
//   cgroup_skb/out   bytes to clients: an HTTP/1.x response parser ends it
//
// Pods are identified by the server socket's local IPv4 address through the
// pod_slots map, which the agent fills; sock_ops gives each accepted
// connection of a pod its state in the socket's storage, including the slot
// of the pod's counters. Any other traffic costs one socket-storage miss.
//
// Per pod we keep requests in flight (N), the sum of the start times of the
// requests in flight (S) and the sum of the durations of completed requests
// (C). The time integral of N up to time t is then C + N*t - S. The three are
// updated together under the pod's bpf_spin_lock and read together by user
// space with BPF_F_LOCK, so a snapshot is never torn.
//
// Sequence numbers, not packets, drive both directions: cgroup_skb ingress runs
// before TCP's own sequence checks, so it sees retransmitted and out-of-order
// segments, and egress sees retransmissions and GSO super-packets. Each side
// remembers the next sequence number it has not seen and only ever looks at
// bytes beyond it.
//
// Minimum kernel: 5.17 (bpf_loop); cmpxchg needs BPF v3 atomics (5.12).

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "accounting.h"

#define AF_INET 2   // from sys/socket.h, which is not for BPF targets
#define AF_INET6 10

// CTX_LOAD reads a context field with a single load instruction.
#define CTX_LOAD(field) (*(volatile typeof(field) *)&(field))

char __license[] SEC("license") = "Dual MIT/GPL";

// A pod's counters live in a slot of pod_counters, which the agent assigns;
// pod_slots finds the slot of an address. Only sock_ops looks an address up,
// once per connection; the packet programs index the array with the slot
// the connection keeps, which the verifier turns into a bounds check and an
// add. (A hash lookup per segment was about 13 % of their run time at
// c = 1.)
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PODS);
	__type(key, __u32);   // pod IPv4, network order
	__type(value, __u32); // its slot in pod_counters
} pod_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_PODS);
	__type(key, __u32);              // slot
	__type(value, struct pod_stats); // counters, see accounting.h; id 0 is a free slot
} pod_counters SEC(".maps");

// Per-connection state lives in the server socket itself: the kernel hands
// the programs the socket, so finding a connection's state costs a pointer
// walk instead of a hash of its four-tuple, and the state goes when the
// socket does, even if its close was never seen.
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC); // required for socket storage
	__type(key, int);                     // a socket (the map's key is its fd from user space)
	__type(value, struct conn);           // parser and request state
} conn_store SEC(".maps");

// conns_by_tuple makes the packet programs find connections in conns, by
// four-tuple, instead of in the socket's storage. Only the tests set it:
// BPF_PROG_TEST_RUN gives every run a new dummy socket, so state kept in a
// socket would not last from one crafted packet to the next.
volatile const __u8 conns_by_tuple = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_TEST_CONNS);  // only the tests fill it
	__uint(map_flags, BPF_F_NO_PREALLOC); // memory follows the live connections
	__type(key, struct conn_key);         // server side of one TCP connection
	__type(value, struct conn);           // parser and request state
} conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ACTIVATORS);
	__type(key, __u32);  // activator pod IPv4, network order
	__type(value, __u8); // unused; presence is what counts
} activators SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EV_MAX);
	__type(key, __u32);   // enum event
	__type(value, __u64); // how often it happened on this CPU
} events SEC(".maps");

static __always_inline void count_event(__u32 ev)
{
	__u64 *n = bpf_map_lookup_elem(&events, &ev);
	// The verifier needs the NULL check even though ev < EV_MAX always.
	if (n)
		*n += 1;
}

// owner returns p, the counters in the connection's slot, if they are still
// those of the pod that accepted the connection; else NULL (the pod is gone,
// and its slot may hold another pod's counters).
static __always_inline struct pod_stats *owner(struct pod_stats *p, const struct conn *c)
{
	if (!p || p->id != c->pod_id)
		return NULL;
	return p;
}

// counters_of returns the counters in the connection's slot (see owner).
static __always_inline struct pod_stats *counters_of(struct conn *c)
{
	return bpf_map_lookup_elem(&pod_counters, &c->slot);
}

static __always_inline void request_started(struct pod_stats *p, int proxied, __u64 now)
{
	bpf_spin_lock(&p->lock);
	p->all.in_flight++;
	p->all.started++;
	p->all.start_sum_ns += now;
	if (proxied) {
		p->proxied.in_flight++;
		p->proxied.started++;
		p->proxied.start_sum_ns += now;
	}
	bpf_spin_unlock(&p->lock);
}

static __always_inline void request_completed(struct pod_stats *p, int proxied, __u64 start, __u64 now)
{
	__u64 took = now > start ? now - start : 0;

	bpf_spin_lock(&p->lock);
	p->all.in_flight--;
	p->all.completed++;
	p->all.start_sum_ns -= start;
	p->all.done_sum_ns += took;
	if (proxied) {
		p->proxied.in_flight--;
		p->proxied.completed++;
		p->proxied.start_sum_ns -= start;
		p->proxied.done_sum_ns += took;
	}
	bpf_spin_unlock(&p->lock);
}

// start_request moves the connection from idle to busy (or to probe, which
// is not load) and counts it. Returns 1 if this call started it.
static __always_inline int start_request(struct pod_stats *pod, struct conn *c, __u32 kind, __u64 now)
{
	struct pod_stats *p;

	// cmpxchg: two CPUs may run ingress for one socket at once (the hook runs
	// before TCP takes the socket lock); only one of them starts the request.
	if (__sync_val_compare_and_swap(&c->req, REQ_IDLE, kind) != REQ_IDLE)
		return 0;
	// Safe to write after the switch: no response can be parsed before this
	// program returns and lets the request bytes reach the socket.
	c->req_start_ns = now;
	p = owner(pod, c);
	if (!p)
		return 1;
	if (kind == REQ_PROBE) {
		__sync_fetch_and_add(&p->probes_total, 1);
		return 1;
	}
	request_started(p, c->proxied, now);
	return 1;
}

// end_request moves a busy or probing connection back to idle and counts a
// completed request. Returns 1 if a counted request ended.
static __always_inline int end_request(struct pod_stats *pod, struct conn *c, __u64 now)
{
	struct pod_stats *p;

	// The plain read spares a locked instruction on the common path.
	if (c->req == REQ_PROBE && __sync_val_compare_and_swap(&c->req, REQ_PROBE, REQ_IDLE) == REQ_PROBE)
		return 0;
	if (__sync_val_compare_and_swap(&c->req, REQ_BUSY, REQ_IDLE) != REQ_BUSY)
		return 0;
	p = owner(pod, c);
	if (p)
		request_completed(p, c->proxied, c->req_start_ns, now);
	return 1;
}

// go_opaque switches a connection to connection-level accounting: from now
// until it closes it is one request in flight, whatever its bytes are.
static __always_inline void go_opaque(struct pod_stats *pod, struct conn *c, __u64 now)
{
	struct pod_stats *p;

	if (__sync_val_compare_and_swap(&c->opaque, 0, 1) != 0)
		return;
	p = owner(pod, c);
	if (p) {
		__sync_fetch_and_add(&p->opaque_in_flight, 1);
		__sync_fetch_and_add(&p->opaque_total, 1);
	}
	// A probe in progress is not load either way; an idle connection becomes
	// a request; a busy one already is.
	if (c->req == REQ_PROBE)
		__sync_val_compare_and_swap(&c->req, REQ_PROBE, REQ_IDLE);
	start_request(pod, c, REQ_BUSY, now);
}

/* ---- sock_ops: connection lifecycle ---- */

// conn_key_of fills the key of a sock_ops socket. Returns 0 if the socket
// carries IPv4: an AF_INET socket, or an AF_INET6 socket whose addresses are
// IPv4-mapped (Go and many other servers listen on [::] for both).
static __always_inline int conn_key_of(struct bpf_sock_ops *skops, struct conn_key *key)
{
	if (skops->family == AF_INET6) {
		// One load per field: the verifier refuses loads through a context
		// pointer that clang offset first, which it does for arrays.
		__u32 l0 = CTX_LOAD(skops->local_ip6[0]);
		__u32 l1 = CTX_LOAD(skops->local_ip6[1]);
		__u32 l2 = CTX_LOAD(skops->local_ip6[2]);

		if (l0 != 0 || l1 != 0 || l2 != bpf_htonl(0xffff))
			return -1;
		key->pod_ip = CTX_LOAD(skops->local_ip6[3]);
		key->peer_ip = CTX_LOAD(skops->remote_ip6[3]);
	} else if (skops->family == AF_INET) {
		key->pod_ip = skops->local_ip4;
		key->peer_ip = skops->remote_ip4;
	} else {
		return -1;
	}
	key->pod_port = bpf_htons((__u16)skops->local_port);
	// remote_port holds the port in network order in its upper half on
	// little endian; ntohl brings it to host order in the low half.
	key->peer_port = bpf_htons((__u16)bpf_ntohl(skops->remote_port));
	return 0;
}

static __always_inline void on_established(struct bpf_sock_ops *skops)
{
	struct conn_key key;
	struct pod_stats *p;
	struct bpf_sock *sk;
	struct conn c = {};
	__u32 *slot;

	if (conn_key_of(skops, &key))
		return;
	slot = bpf_map_lookup_elem(&pod_slots, &key.pod_ip);
	if (!slot)
		return;
	p = bpf_map_lookup_elem(&pod_counters, slot);
	// NULL only for a slot beyond the array, which the agent never writes;
	// id 0: the agent is freeing the slot as the pod goes.
	if (!p || !p->id)
		return;
	sk = skops->sk;
	if (!sk)
		return; // the verifier's rule; an established callback has a socket
	c.pod_id = p->id;
	c.slot = *slot;
	c.rx_next = skops->rcv_nxt;
	c.tx_next = skops->snd_nxt;
	c.hash = FNV_OFFSET; // the response parser starts on an empty token
	c.proxied = bpf_map_lookup_elem(&activators, &key.peer_ip) ? 1 : 0;
	// Creating with c as the initial value fills the storage in one step,
	// before any of the connection's segments can reach the packet programs.
	if (!bpf_sk_storage_get(&conn_store, sk, &c, BPF_SK_STORAGE_GET_F_CREATE)) {
		count_event(EV_CONN_UNTRACKED);
		return;
	}
	__sync_fetch_and_add(&p->conns_in_flight, 1);
	__sync_fetch_and_add(&p->conns_total, 1);
	// Ask for state changes so we see the connection end.
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
}

// on_state_change ends the connection when the server closes its side
// (FIN_WAIT1, LAST_ACK) or the socket dies (CLOSE, also after a reset):
// a server that closed sends nothing more, so any response is complete.
static __always_inline void on_state_change(struct bpf_sock_ops *skops, __u32 state)
{
	struct pod_stats *p;
	struct bpf_sock *sk;
	struct conn *c;
	__u64 now;

	if (state != BPF_TCP_FIN_WAIT1 && state != BPF_TCP_LAST_ACK && state != BPF_TCP_CLOSE)
		return;
	sk = skops->sk;
	if (!sk)
		return; // the verifier's rule; a state callback has a socket
	c = bpf_sk_storage_get(&conn_store, sk, 0, 0);
	if (!c)
		return;
	if (__sync_val_compare_and_swap(&c->closed, 0, 1) == 0) {
		now = bpf_ktime_get_ns();
		p = owner(counters_of(c), c);
		end_request(p, c, now);
		if (p) {
			__sync_fetch_and_add(&p->conns_in_flight, -1);
			if (c->opaque)
				__sync_fetch_and_add(&p->opaque_in_flight, -1);
		}
	}
	if (state == BPF_TCP_CLOSE)
		bpf_sk_storage_delete(&conn_store, sk); // frees it now, not with the socket
}

SEC("sockops")
int sockscale_sockops(struct bpf_sock_ops *skops)
{
	switch (skops->op) {
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		on_established(skops);
		break;
	case BPF_SOCK_OPS_STATE_CB:
		on_state_change(skops, skops->args[1]);
		break;
	}
	return 1;
}


/* ---- parsing helpers ---- */

static __always_inline __u8 lower(__u8 ch)
{
	return (ch >= 'A' && ch <= 'Z') ? ch + ('a' - 'A') : ch;
}

// token_add appends ch to the token whose length and hash are *pos and *hash.
static __always_inline void token_add(__u8 *pos, __u32 *hash, __u8 ch)
{
	*hash = (*hash ^ ch) * FNV_PRIME;
	if (*pos < 255)
		*pos += 1;
}

static __always_inline void token_reset(__u8 *pos, __u32 *hash)
{
	*pos = 0;
	*hash = FNV_OFFSET;
}

// What the parse loops need besides the connection's own fields.
struct parse_ctx {
	// The window of packet bytes being parsed. Aligned so that whole words
	// can be read from it: the verifier refuses unaligned stack loads.
	__u8 buf[SCAN_WINDOW] __attribute__((aligned(8)));
	struct __sk_buff *skb; // the packet, for the window loads
	struct conn *c;        // parser state and scratch (see struct conn)
};

// load_window copies the packet bytes [off, min(end, off + SCAN_WINDOW))
// into buf. Returns how many (at least 1), or 0 if there are none or the
// load failed. The bytes of buf beyond that count are stale.
static __always_inline __u32 load_window(struct parse_ctx *s, __u32 off, __u32 end)
{
	__u32 n = end - off;

	// The bounds let the verifier check the variable-size load; off < end
	// is the caller's loop condition, so n == 0 only on a wrapped value.
	if (n > SCAN_WINDOW)
		n = SCAN_WINDOW;
	if (n < 1)
		return 0;
	if (bpf_skb_load_bytes(s->skb, off, s->buf, n))
		return 0;
	return n;
}

// word reads the eight bytes of buf at i*8 as a little-endian integer.
static __always_inline __u64 word(const __u8 *buf, int i)
{
	return *(const __u64 *)(buf + i * 8);
}

// TOKEN8 is the word of an 8-byte string literal, as word() reads it. Shorter
// tokens are padded with \0 and compared under PREFIX_MASK.
#define TOKEN8(s)                                                                                                   \
	((__u64)(s)[0] | (__u64)(s)[1] << 8 | (__u64)(s)[2] << 16 | (__u64)(s)[3] << 24 | (__u64)(s)[4] << 32 |   \
	 (__u64)(s)[5] << 40 | (__u64)(s)[6] << 48 | (__u64)(s)[7] << 56)
#define PREFIX_MASK(n) ((n) >= 8 ? ~0ULL : (1ULL << (8 * (n))) - 1) // the first n bytes of a word

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

// lower8 lowercases the ASCII letters among eight bytes at once: a byte gets
// 0x20 added where it is ASCII, >= 'A' and <= 'Z' (sums of its low seven bits
// carry into its top bit, never into the next byte).
static __always_inline __u64 lower8(__u64 x)
{
	__u64 low7 = x & ~HIGHS;
	__u64 ge_a = low7 + 0x3f * ONES;  // top bit set where byte >= 0x41 'A'
	__u64 gt_z = low7 + 0x25 * ONES;  // top bit set where byte >= 0x5b, past 'Z'
	__u64 upper = ge_a & ~gt_z & ~x & HIGHS;

	return x | (upper >> 2);
}

// find_either returns the index of the first byte of buf[start, n) that is
// a or b, or -1; eight bytes at a time, so a header line we do not care about
// costs a few instructions per word instead of a parse step per byte. A
// loop the compiler keeps rolled: this runs for every header line, and the
// unrolled code was kilobytes that the instruction cache had to hold.
static __always_inline int find_either(const __u8 *buf, __u32 start, __u32 n, __u8 a, __u8 b)
{
	__u32 w;

#pragma clang loop unroll(disable)
	for (w = start / 8; w < SCAN_WINDOW / 8; w++) {
		__u64 x, xa, xb, t, low;
		__u32 k, idx;

		if (n <= w * 8)
			return -1; // the rest of buf is stale
		idx = w * 8;
		// Keeps idx a plain offset from buf: a pointer the compiler steps
		// through the loop is one the verifier cannot bound.
		asm volatile("" : "+r"(idx));
		x = *(const __u64 *)(buf + idx);
		xa = x ^ (a * ONES); // a byte equal to a becomes zero
		xb = x ^ (b * ONES);
		// Bytes before start become 0xff: neither zero nor a borrow that
		// could flag the bytes above them.
		if (start > w * 8) {
			__u64 before = ~(~0ULL << ((start - w * 8) * 8));

			xa |= before;
			xb |= before;
		}
		// The lowest byte flagged in either is the first match: above a
		// zero byte the subtraction's borrow may flag more, never below.
		t = ((xa - ONES) & ~xa & HIGHS) | ((xb - ONES) & ~xb & HIGHS);
		if (!t)
			continue;
		low = t & -t; // bit 8k+7 for the first match at byte k
		k = 0;
		if (low >> 32) {
			k = 4;
			low >>= 32;
		}
		if (low >> 16) {
			k += 2;
			low >>= 16;
		}
		if (low >> 8)
			k += 1;
		if (w * 8 + k >= n)
			return -1; // a stale byte
		return w * 8 + k;
	}
	return -1;
}

static __always_inline int find_lf(const __u8 *buf, __u32 start, __u32 n)
{
	return find_either(buf, start, n, '\n', '\n');
}

/* ---- request side: classify the bytes that start a request ---- */

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

/* ---- response side: find where each response ends ---- */

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

/* ---- cgroup_skb: every TCP segment of every socket below the root ---- */

// load_header copies the 20-byte IP or TCP header at off into dst: straight
// from the packet's linear part when it is there (headers nearly always
// are), else through the helper. Returns 0 on success.
#define HEADER_LEN 20
_Static_assert(sizeof(struct iphdr) == HEADER_LEN && sizeof(struct tcphdr) == HEADER_LEN, "header sizes");
static __always_inline int load_header(struct __sk_buff *skb, __u32 off, void *dst)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	// off is at most 60 (ihl * 4): bounded, so the verifier can check it.
	if (off <= 60 && data + off + HEADER_LEN <= data_end) {
		// Copied in 2-byte units: from a void pointer clang copies byte by
		// byte (120 instructions for the two headers). Not in 4-byte
		// units: headers may sit at 2-byte boundaries, and where unaligned
		// loads are slow (riscv64) the verifier refuses them.
		__builtin_memcpy((__u16 *)dst, (const __u16 *)(data + off), HEADER_LEN);
		return 0;
	}
	return bpf_skb_load_bytes(skb, off, dst, HEADER_LEN);
}

// conn_of returns the state of the pod connection a segment belongs to, or
// NULL if the segment is not on a tracked server connection (the one miss
// that other traffic pays). The caller builds key even though only tests
// use it: building it here, in the branch the verifier prunes as dead when
// conns_by_tuple is 0, hit a verifier bug in Linux 6.18 (precision tracking
// of an unallocated stack slot).
static __always_inline struct conn *conn_of(struct __sk_buff *skb, const struct conn_key *key)
{
	struct bpf_sock *sk;

	if (conns_by_tuple)
		return bpf_map_lookup_elem(&conns, key);
	// Both directions run with the connection's own socket: ingress after
	// TCP found it, egress as it sends.
	sk = skb->sk;
	if (!sk)
		return NULL;
	return bpf_sk_storage_get(&conn_store, sk, 0, 0);
}

// on_segment finds the pod connection a segment belongs to and hands the
// bytes it has not seen before to the request or the response side.
static __always_inline int on_segment(struct __sk_buff *skb, int ingress)
{
	struct conn_key key;
	struct tcphdr tcp;
	struct iphdr ip;
	__u32 off, len, seq, end, next;
	struct pod_stats *pod;
	struct conn *c;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return 1;
	if (load_header(skb, 0, &ip))
		return 1;
	if (ip.version != 4 || ip.protocol != IPPROTO_TCP)
		return 1;
	off = ip.ihl * 4;
	if (load_header(skb, off, &tcp))
		return 1;
	off += tcp.doff * 4;
	if (skb->len <= off)
		return 1; // no payload: a pure ACK, SYN or FIN (half the packets)
	key.pod_ip = ingress ? ip.daddr : ip.saddr;
	key.peer_ip = ingress ? ip.saddr : ip.daddr;
	key.pod_port = ingress ? tcp.dest : tcp.source;
	key.peer_port = ingress ? tcp.source : tcp.dest;
	c = conn_of(skb, &key);
	if (!c || c->closed)
		return 1;
	len = skb->len - off;
	seq = bpf_ntohl(tcp.seq);
	end = seq + len;
	next = ingress ? c->rx_next : c->tx_next;
	if ((__s32)(end - next) <= 0)
		return 1; // every byte was seen before: a retransmission
	if ((__s32)(next - seq) > 0)
		off += next - seq; // a retransmission with new bytes at its end
	// Once the agent removed the pod, the parse goes on so the connection's
	// state stays right, and owner() skips the counting.
	pod = counters_of(c);
	if (ingress) {
		c->rx_next = end;
		on_request_bytes(skb, pod, c, off, skb->len);
	} else {
		c->tx_next = end;
		on_response_bytes(skb, pod, c, off, skb->len);
	}
	return 1;
}

// Bytes from clients to pods. Hook: cgroup_skb ingress at the root. Never
// drops: always returns 1 (allow).
SEC("cgroup_skb/ingress")
int sockscale_ingress(struct __sk_buff *skb)
{
	return on_segment(skb, 1);
}

// Bytes from pods to clients. Hook: cgroup_skb egress at the root. Never
// drops: always returns 1 (allow).
SEC("cgroup_skb/egress")
int sockscale_egress(struct __sk_buff *skb)
{
	return on_segment(skb, 0);
}
