// SPDX-License-Identifier: (MIT OR GPL-2.0)
// Per-pod counters: finding a connection's pod in pod_counters (maps.h), and
// the request transitions of a connection (idle, busy, probe, opaque) that
// change them. N, S and C (see accounting.c) change together under the
// pod's spin lock; the other counters are atomic adds.

#ifndef SOCKSCALE_LIB_COUNTERS_H
#define SOCKSCALE_LIB_COUNTERS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "../accounting.h"
#include "maps.h"

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

// request_started counts a request that started at now, under the pod's
// lock: N and started up by one, now added to S; the proxied counters too
// when the client is an activator.
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

// request_completed counts the end of a request that started at start,
// under the pod's lock: N down by one, start taken off S, its duration added
// to C; the proxied counters too when the client is an activator.
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

#endif
