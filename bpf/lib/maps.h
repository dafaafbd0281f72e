// SPDX-License-Identifier: (MIT OR GPL-2.0)
// The maps the agent shares with the programs: it fills pod_slots,
// pod_counters and activators, and reads pod_counters and events
// (accounting_linux.go). The connections' own state is in conn.h.

#ifndef SOCKSCALE_LIB_MAPS_H
#define SOCKSCALE_LIB_MAPS_H

#include <linux/bpf.h>
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
	__type(key, __u32);   // pod IPv4, network order
	__type(value, __u32); // its slot in pod_counters
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
	__type(key, __u32);  // activator pod IPv4, network order
	__type(value, __u8); // unused; presence is what counts
} activators SEC(".maps");

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

#endif
