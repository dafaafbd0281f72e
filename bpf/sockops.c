// SPDX-License-Identifier: (MIT OR GPL-2.0)
//go:build ignore

// Program sockscale_sockops: the connection lifecycle. Included by
// accounting.c, not compiled on its own.
//
// Hook: sock_ops at the cgroup v2 root (BPF_CGROUP_SOCK_OPS).
// Counts: per pod, connections accepted and open (conns_total,
// conns_in_flight); when a connection ends, the request it had in flight is
// completed and an opaque connection stops counting (opaque_in_flight). On
// accept it gives the connection its state in the socket's storage, which
// the packet programs find and count with, and takes over what ingress
// parsed of the connection's first bytes if they came before it (counting
// the requests they began, at the time they came).
// Minimum kernel: 5.17, that of the object it is loaded in (the packet
// programs use bpf_loop); the segment's header in the callback needs 5.10.

#include <linux/bpf.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "accounting.h"
#include "lib/accept.h"
#include "lib/adopt.h"
#include "lib/conn.h"
#include "lib/counters.h"
#include "lib/h2.h"
#include "lib/maps.h"

#define AF_INET 2   // from sys/socket.h, which is not for BPF targets
#define AF_INET6 10

// CTX_LOAD reads a context field with a single load instruction.
#define CTX_LOAD(field) (*(volatile typeof(field) *)&(field))

// conn_key_of fills the key of a sock_ops socket. Returns 0 if the socket
// is TCP over IPv4 or IPv6 (an AF_INET6 socket's IPv4 peers, of a server
// listening on [::] for both, have IPv4-mapped addresses already: the
// maps' form).
static __always_inline int conn_key_of(struct bpf_sock_ops *skops, struct conn_key *key)
{
	if (skops->family == AF_INET6) {
		// One load per field: the verifier refuses loads through a context
		// pointer that clang offset first, which it does for arrays.
		key->pod_ip.w[0] = CTX_LOAD(skops->local_ip6[0]);
		key->pod_ip.w[1] = CTX_LOAD(skops->local_ip6[1]);
		key->pod_ip.w[2] = CTX_LOAD(skops->local_ip6[2]);
		key->pod_ip.w[3] = CTX_LOAD(skops->local_ip6[3]);
		key->peer_ip.w[0] = CTX_LOAD(skops->remote_ip6[0]);
		key->peer_ip.w[1] = CTX_LOAD(skops->remote_ip6[1]);
		key->peer_ip.w[2] = CTX_LOAD(skops->remote_ip6[2]);
		key->peer_ip.w[3] = CTX_LOAD(skops->remote_ip6[3]);
	} else if (skops->family == AF_INET) {
		ip_addr_v4(&key->pod_ip, skops->local_ip4);
		ip_addr_v4(&key->peer_ip, skops->remote_ip4);
	} else {
		return -1;
	}
	key->pod_port = bpf_htons((__u16)skops->local_port);
	// remote_port holds the port in network order in its upper half on
	// little endian; ntohl brings it to host order in the low half.
	key->peer_port = bpf_htons((__u16)bpf_ntohl(skops->remote_port));
	return 0;
}

// handshake_payload returns how many bytes the segment that established
// the connection carried: a request on the ACK that completes the
// handshake, or on a SYN (TCP Fast Open), which ingress saw at the
// listening socket. The callback has the segment's TCP header, not its
// payload.
static __always_inline __u32 handshake_payload(struct bpf_sock_ops *skops)
{
	void *data = (void *)(long)skops->skb_data;
	void *data_end = (void *)(long)skops->skb_data_end;
	struct tcphdr *th = data;
	__u32 len = skops->skb_len;

	if (data + sizeof(*th) > data_end)
		return 0; // no segment, or the verifier's rule
	if (len <= th->doff * 4)
		return 0;
	return len - th->doff * 4;
}

static __always_inline void on_established(struct bpf_sock_ops *skops)
{
	struct conn c = {}, *s = NULL, *init, *stored;
	struct h2_conn *h2 = NULL;
	struct conn_key key;
	struct pod_stats *p;
	struct bpf_sock *sk;
	__u32 *slot, payload;

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
	payload = handshake_payload(skops);
	if (payload)
		s = bpf_map_lookup_elem(&stash, &key);
	init = first_state(&c, s, *slot, peer_kind(&key.peer_ip), skops->rcv_nxt, skops->snd_nxt, payload);
	// HTTP/2 frames that ingress walked before the accept (lib/h2.h): their
	// state is the socket's before the connection's is.
	if (s && init == s && s->h2 == H2_FOLLOW)
		h2 = h2_accept_stash(sk, &key, s);
	// Creating with init as the initial value fills the storage in one
	// step, before any of the connection's segments can reach the packet
	// programs.
	stored = sk_storage_make(&conn_store, sk, init);
	if (s)
		bpf_map_delete_elem(&stash, &key);
	if (!stored) {
		count_event(EV_CONN_UNTRACKED);
		return;
	}
	// The agent may have learned it from the socket table in the instant
	// before this callback (it never learns one its server has not
	// accepted, but a check can be slow): it counts here now.
	forget_learned_sock(bpf_get_socket_cookie(skops));
	// Not counted if the slot changed hands since the lookup; the state
	// stays (TENURE_NONE counts nowhere) and is freed when the socket closes.
	count_accepted(p, stored, h2, &key.pod_ip);
	// Ask for state changes so we see the connection end.
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
}

// on_state_change ends the connection when the server closes its side
// (FIN_WAIT1, LAST_ACK) or the socket dies (CLOSE, also after a reset):
// a server that closed sends nothing more, so any response is complete.
static __always_inline void on_state_change(struct bpf_sock_ops *skops, __u32 state)
{
	struct h2_conn *h = NULL;
	struct bpf_sock *sk;
	struct conn *c;
	__u8 h2;

	if (state != BPF_TCP_FIN_WAIT1 && state != BPF_TCP_LAST_ACK && state != BPF_TCP_CLOSE)
		return;
	sk = skops->sk;
	if (!sk)
		return; // the verifier's rule; a state callback has a socket
	c = bpf_sk_storage_get(&conn_store, sk, 0, 0);
	if (!c)
		return;
	h2 = c->h2;
	if (h2)
		h = bpf_sk_storage_get(&h2_store, sk, 0, 0);
	if (!c->closed)
		close_conn(counters_of(c), c, h, bpf_ktime_get_ns());
	if (state == BPF_TCP_CLOSE) {
		bpf_sk_storage_delete(&conn_store, sk); // frees it now, not with the socket
		if (h2)
			bpf_sk_storage_delete(&h2_store, sk);
	}
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
