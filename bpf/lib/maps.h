// SPDX-License-Identifier: (MIT OR GPL-2.0)
// The maps the agent shares with the programs: it fills pod_slots,
// pod_counters and activators, and reads pod_counters and events
// (accounting_linux.go). The connections' own state is in conn.h.

#ifndef SOCKSCALE_LIB_MAPS_H
#define SOCKSCALE_LIB_MAPS_H

#include <linux/bpf.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "../accounting.h"

// A pod's counters live in a slot of pod_counters, which the agent assigns;
// pod_slots finds the slot of an address. Only sock_ops looks an address up,
// once per connection; the packet programs index the array with the slot
// the connection keeps, which the verifier turns into a bounds check and an
// add. (A hash lookup per segment was about 13 % of their run time at
// c = 1.)
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_PODS);
	__type(key, struct ip_addr); // pod address (IPv4-mapped or IPv6)
	__type(value, __u32);        // its slot in pod_counters
} pod_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_PODS);
	__type(key, __u32);              // slot
	__type(value, struct pod_stats); // counters, see accounting.h; id 0 is a free slot
} pod_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ACTIVATORS);
	__type(key, struct ip_addr); // activator pod address (IPv4-mapped or IPv6)
	__type(value, __u8);         // unused; presence is what counts
} activators SEC(".maps");

// The node's own addresses, which the agent follows over netlink: the
// kubelet's health probes come from one of them. With the activators, the
// only clients whose requests may be health probes (see peer_kind).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_NODE_ADDRS);
	__type(key, struct ip_addr); // node address (IPv4-mapped or IPv6)
	__type(value, __u8);         // unused; presence is what counts
} node_addrs SEC(".maps");

// Connections the agent learned from the socket table, by socket cookie
// (see struct learned_conn). The programs delete an entry at the
// connection's first segment (lib/adopt.h); the agent deletes those whose
// socket is gone. Whoever deletes it accounts for it.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_LEARNED);
	__uint(map_flags, BPF_F_NO_PREALLOC); // memory follows the learned connections, mostly none
	__type(key, __u64);                   // socket cookie
	__type(value, struct learned_conn);   // the pod it counts for
} learned SEC(".maps");

// Per slot, the agent's correction of the open connections (struct
// conn_adjust). Only the agent reads and writes it; it lives here to be
// pinned and versioned with the counters it corrects.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_PODS);
	__type(key, __u32);                 // slot
	__type(value, struct conn_adjust);  // written by the agent only
} conn_adjusts SEC(".maps");

// Server connections of pods that are leaving, which the agent puts here
// (by socket: the value it writes is a file descriptor of the socket) so
// that sockscale_drain sees what their servers write (drain.c). A socket
// leaves the map when it closes.
struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, MAX_DRAINING);
	__type(key, __u64);   // socket cookie
	__type(value, __u64); // the socket (a file descriptor when written, its cookie when read)
} draining SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EV_MAX);
	__type(key, __u32);   // enum event
	__type(value, __u64); // how often it happened on this CPU
} events SEC(".maps");

// count_event adds one to ev's counter on this CPU.
static __always_inline void count_event(__u32 ev)
{
	__u64 *n = bpf_map_lookup_elem(&events, &ev);
	// The verifier needs the NULL check even though ev < EV_MAX always.
	if (n)
		*n += 1;
}

// ip_addr_v4 sets a to the IPv4 address v4 (network order), mapped.
static __always_inline void ip_addr_v4(struct ip_addr *a, __u32 v4)
{
	a->w[0] = 0;
	a->w[1] = 0;
	a->w[2] = bpf_htonl(0xffff);
	a->w[3] = v4;
}

// ip_addr_is_v4 returns whether a is an IPv4 address (mapped).
static __always_inline int ip_addr_is_v4(const struct ip_addr *a)
{
	return a->w[0] == 0 && a->w[1] == 0 && a->w[2] == bpf_htonl(0xffff);
}

// ip_addr_eq returns whether a and b are the same address.
static __always_inline int ip_addr_eq(const struct ip_addr *a, const struct ip_addr *b)
{
	return a->w[0] == b->w[0] && a->w[1] == b->w[1] && a->w[2] == b->w[2] && a->w[3] == b->w[3];
}

// Who a connection's client is, as first_state and adopt record it.
enum {
	PEER_ACTIVATOR = 1, // an activator: its requests count as proxied, and its prober's as probes
	PEER_NODE = 2,      // the node itself: the kubelet's probes are probes
};

// peer_kind returns the PEER_* flags of a client address (0: any other
// client, whose requests are all load, whatever their User-Agent says).
static __always_inline __u8 peer_kind(const struct ip_addr *peer_ip)
{
	struct ip_addr any = {.w = {0, 0, bpf_htonl(0xffff), 0}};

	if (bpf_map_lookup_elem(&activators, peer_ip))
		return PEER_ACTIVATOR;
	if (bpf_map_lookup_elem(&node_addrs, peer_ip))
		return PEER_NODE;
	// 0.0.0.0 among the node's addresses: the agent cannot see the node's
	// network namespace and was told to take a probe's User-Agent from any
	// client, of either family (its --probe-sources=any).
	if (bpf_map_lookup_elem(&node_addrs, &any))
		return PEER_NODE;
	return 0;
}

#endif
