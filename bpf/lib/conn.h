// SPDX-License-Identifier: (MIT OR GPL-2.0)
// Where a connection's state (struct conn, accounting.h) lives and how a
// segment finds it: in the server socket's storage, which sock_ops fills on
// accept. The test object keeps it by four-tuple instead (SOCKSCALE_TEST_TUPLE).

#ifndef SOCKSCALE_LIB_CONN_H
#define SOCKSCALE_LIB_CONN_H

#include <linux/bpf.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>

#include "../accounting.h"

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
static __always_inline struct conn *conn_of(struct __sk_buff *skb, const struct iphdr *ip,
					    const struct tcphdr *tcp, int ingress)
{
	struct conn_key key;

	key.pod_ip = ingress ? ip->daddr : ip->saddr;
	key.peer_ip = ingress ? ip->saddr : ip->daddr;
	key.pod_port = ingress ? tcp->dest : tcp->source;
	key.peer_port = ingress ? tcp->source : tcp->dest;
	return bpf_map_lookup_elem(&conns, &key);
}
#else
// conn_of returns the state of the pod connection a segment belongs to, or
// NULL if the segment is not on a tracked server connection (the one miss
// that other traffic pays). ip, tcp and ingress are for the test object's
// four-tuple lookup (above); here the socket is enough.
static __always_inline struct conn *conn_of(struct __sk_buff *skb, const struct iphdr *ip,
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

#endif
