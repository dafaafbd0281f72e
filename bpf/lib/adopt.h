// SPDX-License-Identifier: (MIT OR GPL-2.0)
// Connections that were open before these programs were loaded. An agent
// upgrade loads a new build, whose socket storage is new (each build pins
// maps of its own layout, accounting_linux.go), so the connections the
// previous build followed have no state here; neither have those accepted
// before any accounting ran or before their pod was added. Without state
// they counted nothing until they reconnected: 8 keep-alive clients at
// 376 requests/s read as 0 requests and 0 connections after an upgrade.
//
// Ingress adopts such a connection at its next client segment: it counts
// as a connection from then on, and both parsers start lost, so its
// requests count again from the next whole request line (the resync of
// request.h) and nothing is in flight before that. Only this cold path,
// a connection's first segment without state, pays for it: the packet
// programs' work on connections with state is unchanged.

#ifndef SOCKSCALE_LIB_ADOPT_H
#define SOCKSCALE_LIB_ADOPT_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "../accounting.h"
#include "accept.h"
#include "conn.h"
#include "counters.h"
#include "h2.h"
#include "maps.h"

// Where adopt builds a connection's first state, which is created from it
// in one step (as sock_ops does), so egress never sees it half made. Not
// on the stack: the stack of ingress has no room for it beside the
// parser's. Per CPU, and used by ingress alone, which runs in softirq
// context and so never interrupts itself on one CPU.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);         // 0
	__type(value, struct conn); // scratch
} conn_scratch SEC(".maps");

#ifdef SOCKSCALE_TEST_TUPLE
// The test object only: which four-tuples stand for sockets TCP has
// established (a test run's socket is a dummy): 1 a pod's server
// connection, 0 a pod's own client connection. Without an entry, a
// segment of no connection in conns reached a listening socket (conn.h).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_TEST_CONNS);
	__type(key, struct conn_key); // server side of one TCP connection
	__type(value, __u8);          // 1: accepted by a listener, 0: the pod connected out
} test_sockets SEC(".maps");

// established, accepted: see the production ones below.
static __always_inline int established(struct __sk_buff *skb, struct conn_key *key)
{
	return bpf_map_lookup_elem(&test_sockets, key) != NULL;
}

static __always_inline int accepted(struct __sk_buff *skb, struct conn_key *key)
{
	__u8 *server = bpf_map_lookup_elem(&test_sockets, key);

	return server && *server;
}

// store_state: see the production one below.
static __always_inline struct conn *store_state(struct __sk_buff *skb, struct conn_key *key, struct conn *init)
{
	if (bpf_map_update_elem(&conns, key, init, BPF_NOEXIST))
		return NULL;
	return bpf_map_lookup_elem(&conns, key);
}
#else
// established returns 1 if the segment's socket is an established TCP
// connection (key is its server side); else a listener's segment goes to
// the stash (conn.h), and other sockets' are not ours.
static __always_inline int established(struct __sk_buff *skb, struct conn_key *key)
{
	struct bpf_sock *sk = skb->sk;

	return sk && sk->state == BPF_TCP_ESTABLISHED;
}

// accepted returns 1 if the established connection key was accepted by a
// listener, 0 if it is the pod's own client connection (nothing listens
// on its local port).
static __always_inline int accepted(struct __sk_buff *skb, struct conn_key *key)
{
	struct bpf_sock_tuple t = {};
	struct bpf_sock *l;

	// No peer in the tuple: no established socket matches it, so the
	// lookup finds the listener of the local address and port, if any
	// (also one on [::] for both families). An IPv4 address, mapped in the
	// key, is looked up as IPv4.
	if (ip_addr_is_v4(&key->pod_ip)) {
		t.ipv4.daddr = key->pod_ip.w[3];
		t.ipv4.dport = key->pod_port;
		l = bpf_sk_lookup_tcp(skb, &t, sizeof(t.ipv4), BPF_F_CURRENT_NETNS, 0);
	} else {
		__builtin_memcpy(t.ipv6.daddr, key->pod_ip.w, sizeof(t.ipv6.daddr));
		t.ipv6.dport = key->pod_port;
		l = bpf_sk_lookup_tcp(skb, &t, sizeof(t.ipv6), BPF_F_CURRENT_NETNS, 0);
	}
	if (!l)
		return 0;
	bpf_sk_release(l);
	return 1;
}

// store_state creates the socket's state from init and returns it, or NULL
// (no memory, or not a full socket).
static __always_inline struct conn *store_state(struct __sk_buff *skb, struct conn_key *key, struct conn *init)
{
	struct bpf_sock *sk = skb->sk;

	if (!sk)
		return NULL; // the verifier's rule; established() saw one
	return sk_storage_make(&conn_store, sk, init);
}
#endif

// forget_learned_sock hands a connection the agent learned from the socket
// table (struct learned_conn) back to the programs at its first segment
// since: the agent's correction stops counting it (learned_gone, under
// the slot's lock like every count) and the programs count it from here
// if it is still open (adopt). Deleting the entry decides who accounts for
// it: the agent deletes the entries whose socket it finds gone and takes
// them off its correction itself. cookie is the socket's.
static __always_inline void forget_learned_sock(__u64 cookie)
{
	struct learned_conn *l, was;
	struct pod_stats *p;

	l = bpf_map_lookup_elem(&learned, &cookie);
	if (!l)
		return; // nearly always: the agent learns few connections
	was = *l;
	if (bpf_map_delete_elem(&learned, &cookie))
		return; // the agent deleted it first
	p = bpf_map_lookup_elem(&pod_counters, &was.slot);
	if (!p)
		return; // a slot beyond the array: the agent never writes one
	bpf_spin_lock(&p->lock);
	if (p->tenure == was.tenure)
		p->learned_gone++; // else the slot was reset, and its correction with it
	bpf_spin_unlock(&p->lock);
}

// forget_learned forgets the learned connection of a segment's socket
// (see forget_learned_sock).
static __always_inline void forget_learned(struct __sk_buff *skb)
{
	forget_learned_sock(bpf_get_socket_cookie(skb));
}

// forget_learned_of forgets a learned connection (see forget_learned) of a
// segment without state, at the segment that ends it: a FIN or RST. pod_ip
// is the pod's side of the segment; other traffic pays one pod_slots miss.
static __always_inline void forget_learned_of(struct __sk_buff *skb, const struct ip_addr *pod_ip)
{
	if (bpf_map_lookup_elem(&pod_slots, pod_ip))
		forget_learned(skb);
}

// adopt gives state to the connection of a client segment that has none,
// key its server side, seq its first sequence number, ack the server's
// bytes the client has received and off where its payload starts. A
// global function, checked once by the verifier. Returns 1 if the
// connection now has state to count with (the caller finds it again), 0
// if the segment is not on an established socket, -1 if it is, but no
// pod's server connection.
__attribute__((noinline)) int adopt(struct __sk_buff *skb, struct conn_key *key, __u32 seq, __u32 ack, __u32 off)
{
	struct conn *init, *zero, *c;
	struct pod_stats *p;
	__u32 *slot, k = 0;
	__u8 peer;

	if (!key)
		return 0; // the verifier's rule for a global function's pointers
#ifdef SOCKSCALE_TEST_TUPLE
	// The test object uses no skb here, and clang then passes garbage for
	// it, which the verifier refuses for a global function's context.
	asm volatile("" ::"r"(skb));
#endif
	if (!established(skb, key))
		return 0;
	// Cheapest test first: other traffic pays this one miss.
	slot = bpf_map_lookup_elem(&pod_slots, &key->pod_ip);
	if (!slot)
		return -1; // not a pod's: other traffic
	p = bpf_map_lookup_elem(&pod_counters, slot);
	init = bpf_map_lookup_elem(&conn_scratch, &k);
	zero = bpf_map_lookup_elem(&conn_zero, &k);
	if (!p || !init || !zero)
		return -1; // a slot beyond the array (the agent never writes one); arrays of one
	*init = *zero;
	if (!accepted(skb, key)) {
		// The pod's own client connection. State that says so (closed)
		// makes the decision once per socket, not on each segment.
		init->closed = 1;
		store_state(skb, key, init);
		return -1;
	}
	init->tenure = TENURE_NONE; // count_accepted sets it, under the lock
	init->slot = *slot;
	peer = peer_kind(&key->peer_ip);
	init->proxied = (peer & PEER_ACTIVATOR) ? 1 : 0;
	if (!peer)
		load_only(init);
	init->rx_next = seq;
	// Server bytes the client has not acknowledged yet are taken as new
	// when sent again; the response parser is lost, so they count nothing.
	init->tx_next = ack;
	init->rx.hash = FNV_OFFSET; // the parsers start on an empty token
	init->tx.hash = FNV_OFFSET;
	init->adopted = 1;
	// The HTTP/2 preface is only ever a connection's first bytes: one
	// accepted before its pod was known (a new pod, probed by the
	// activators before the agent has its address) is followed from here
	// as a new connection is, its streams one by one.
	if (!h2_preface(skb, off, skb->len)) {
		// Both parsers lost: requests from the next whole request line,
		// responses from the next status line (no request is in flight).
		// The client has spoken and the connection is HTTP/1.x as far as
		// we know: a later parse failure loses the stream, it does not go
		// opaque.
		init->rx.state = MS_LOST;
		init->tx.state = MS_LOST;
		init->seen = 1;
		init->answered = 1;
	}
	c = store_state(skb, key, init);
	if (!c) {
		count_event(EV_CONN_UNTRACKED);
		return -1;
	}
	// If the agent learned the connection, it counts here from now on.
	forget_learned(skb);
	count_accepted(p, c, NULL, &key->pod_ip);
	count_event(EV_ADOPTED);
	return 1;
}

// end_adopted ends an adopted connection: segment.h calls it at a FIN or
// RST of the server (egress) or an RST of the client (ingress). sock_ops
// may never see such a connection close: only sockets whose establishment
// a sock_ops program saw asked for state callbacks (a previous build's
// did; those accepted before any accounting ran did not). A client's FIN
// only half-closes; the server closes next. close_conn ignores a second
// end (the state callback's too). A global function: one copy of
// close_conn for the verifier, where two call sites would inline two. h
// is the connection's HTTP/2 state (adopted at its preface), else NULL.
// Returns 0.
__attribute__((noinline)) int end_adopted(struct conn *c, struct h2_conn *h)
{
	if (!c || !c->adopted || c->closed)
		return 0; // NULL: the verifier's rule for a global function's pointers
	close_conn(counters_of(c), c, h, bpf_ktime_get_ns());
	return 0;
}

#endif
