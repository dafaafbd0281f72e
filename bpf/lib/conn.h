// SPDX-License-Identifier: (MIT OR GPL-2.0)
// Where a connection's state (struct conn, accounting.h) lives and how a
// segment finds it: in the server socket's storage, which sock_ops fills on
// accept.

#ifndef SOCKSCALE_LIB_CONN_H
#define SOCKSCALE_LIB_CONN_H

#include <linux/bpf.h>
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

#endif
