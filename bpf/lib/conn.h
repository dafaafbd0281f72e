// SPDX-License-Identifier: (MIT OR GPL-2.0)
// Where a connection's state (struct conn, accounting.h) lives and how a
// segment finds it: in the server socket's storage, which sock_ops fills on
// accept (accept.h). The test object keeps it by four-tuple instead
// (SOCKSCALE_TEST_TUPLE). Client bytes that reach a pod's listening socket,
// before the accept, are parsed into a stash keyed by four-tuple.

#ifndef SOCKSCALE_LIB_CONN_H
#define SOCKSCALE_LIB_CONN_H

#include <linux/bpf.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>

#include "../accounting.h"
#include "ip.h"
#include "maps.h"

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

// A connection's first client bytes can reach its server's listening socket
// before the connection is established: on the segment that completes the
// handshake (TCP_DEFER_ACCEPT, as nginx's "deferred" sets; or the client's
// ACK was lost) or on a SYN (TCP Fast Open). Ingress parses them into a
// stash entry, counting nothing, and sock_ops adopts it when the
// connection is accepted a moment later (accept.h). LRU: an entry whose
// connection never comes is evicted.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_STASHED);
	__type(key, struct conn_key); // server side of the connection
	__type(value, struct conn);   // what ingress parsed before the accept
} stash SEC(".maps");

// One zeroed struct conn: what a stash entry starts from. A packet
// program's stack has no room for one beside the parser's window.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);         // 0
	__type(value, struct conn); // never written
} conn_zero SEC(".maps");

// segment_key fills key, the server side of the connection a segment
// belongs to: ip and tcp are its headers, and ingress says which side of
// them is the pod's.
static __always_inline void segment_key(struct conn_key *key, const struct seg_ips *ip,
					const struct tcphdr *tcp, int ingress)
{
	key->pod_ip = ingress ? ip->daddr : ip->saddr;
	key->peer_ip = ingress ? ip->saddr : ip->daddr;
	key->pod_port = ingress ? tcp->dest : tcp->source;
	key->peer_port = ingress ? tcp->source : tcp->dest;
}

// sk_storage_make returns a socket's storage in map, created from init if
// it has none. Creating is not atomic with finding: when two CPUs create
// at once (the server's first bytes leave as the client's arrive), the
// loser's create fails, and it finds the winner's.
#define sk_storage_make(map, sk, init)                                                    \
	({                                                                                 \
		void *_s = bpf_sk_storage_get(map, sk, init, BPF_SK_STORAGE_GET_F_CREATE); \
		_s ? _s : bpf_sk_storage_get(map, sk, 0, 0);                               \
	})

#ifdef SOCKSCALE_TEST_TUPLE
// The test object only (accountingtest, built with -DSOCKSCALE_TEST_TUPLE,
// see gen.go): the packet programs find connections in conns, by
// four-tuple, instead of in the socket's storage. BPF_PROG_TEST_RUN gives
// every run a new dummy socket, so state kept in a socket would not last
// from one crafted packet to the next. A switch at build time, not a
// load-time knob, so the production object has neither the map nor a key
// built on every segment.
#define MAX_TEST_CONNS 64 // connections the tests create

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_TEST_CONNS);  // only the tests fill it
	__uint(map_flags, BPF_F_NO_PREALLOC); // memory follows the live connections
	__type(key, struct conn_key);         // server side of one TCP connection
	__type(value, struct conn);           // parser and request state
} conns SEC(".maps");

// conn_of returns the state of the pod connection a segment belongs to, or
// NULL if the segment is not on a tracked server connection. ip and tcp are
// the segment's headers; ingress says which side of them is the pod's.
static __always_inline struct conn *conn_of(struct __sk_buff *skb, const struct seg_ips *ip,
					    const struct tcphdr *tcp, int ingress)
{
	struct conn_key key;

	segment_key(&key, ip, tcp, ingress);
	return bpf_map_lookup_elem(&conns, &key);
}
#else
// conn_of returns the state of the pod connection a segment belongs to, or
// NULL if the segment is not on a tracked server connection (the one miss
// that other traffic pays). ip, tcp and ingress are for the test object's
// four-tuple lookup (above); here the socket is enough.
static __always_inline struct conn *conn_of(struct __sk_buff *skb, const struct seg_ips *ip,
					    const struct tcphdr *tcp, int ingress)
{
	struct bpf_sock *sk;

	// Both directions run with the connection's own socket: ingress after
	// TCP found it, egress as it sends.
	sk = skb->sk;
	if (!sk)
		return NULL;
	return bpf_sk_storage_get(&conn_store, sk, 0, 0);
}
#endif

// stash_conn returns the stash entry for client bytes from seq on that
// reached a pod's listening socket, or NULL for other segments. An entry
// whose bytes end at seq goes on with them: a second segment reaches the
// listener too when another CPU is still turning the first into the
// connection. Else it is created afresh (a segment sent again before the
// accept is parsed again).
static __always_inline struct conn *stash_conn(struct __sk_buff *skb, const struct seg_ips *ip,
					       const struct tcphdr *tcp, __u32 seq)
{
	struct conn_key key;
	struct conn *zero, *c;
	__u32 *slot, k = 0;

#ifdef SOCKSCALE_TEST_TUPLE
	// The test object: a segment of no connection in conns stands for one
	// that reached the listening socket (a test run's socket is a dummy).
#else
	struct bpf_sock *sk = skb->sk;

	if (!sk || sk->state != BPF_TCP_LISTEN)
		return NULL; // not a listener: another socket's traffic
#endif
	slot = bpf_map_lookup_elem(&pod_slots, &ip->daddr);
	if (!slot)
		return NULL; // not a pod's
	segment_key(&key, ip, tcp, 1);
	c = bpf_map_lookup_elem(&stash, &key);
	if (c && c->rx_next == seq && c->rx_first != seq)
		return c;
	zero = bpf_map_lookup_elem(&conn_zero, &k);
	if (!zero || bpf_map_update_elem(&stash, &key, zero, BPF_ANY))
		return NULL; // NULL only in theory: an array of one
	c = bpf_map_lookup_elem(&stash, &key);
	if (!c)
		return NULL; // evicted at once by other CPUs' entries
	// tenure stays 0, which no pod's slot has (owner() counts nothing)
	// until the accept sets it.
	c->slot = *slot;
	c->rx_next = seq;
	c->rx_first = seq;
	c->rx.hash = FNV_OFFSET; // the parsers start on an empty token
	c->tx.hash = FNV_OFFSET;
	return c;
}

#endif
