// SPDX-License-Identifier: (MIT OR GPL-2.0)
// Per-pod counters: finding a connection's pod in pod_counters (maps.h), and
// the transitions of a connection's requests (counted, completed, the
// connection opaque or closed) that change them. N, S and C (see
// accounting.c) change together under the pod's spin lock, and so do the
// connection's request ring and its closed and opaque flags: ingress and
// egress of one connection run on different CPUs, and ingress runs before
// TCP locks the socket.
//
// Every change a connection makes to its slot happens under the slot's
// lock, after checking there that the slot is still its pod's (owner()).
// The agent resets a slot when a pod goes or another takes it, with a
// BPF_F_LOCK update, which writes the whole value under the same lock. So a
// connection either counts before the reset (and the reset wipes it) or
// sees the new id and counts nothing: a checked owner cannot go stale
// before the count, and a new pod never starts with another pod's N, S, C or
// connections. (Checked outside the lock, a connection that passed the
// check just before the reset counted into the next pod:
// TestKernelSlotReuseRace.) The counters outside N, S and C are plain adds
// for the same reason: all of them change under the lock.

#ifndef SOCKSCALE_LIB_COUNTERS_H
#define SOCKSCALE_LIB_COUNTERS_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "../accounting.h"
#include "maps.h"

#define RING_MASK (MAX_PIPELINE - 1)
_Static_assert((MAX_PIPELINE & RING_MASK) == 0 && MAX_PIPELINE <= 16, "the ring's flags are bits of a __u16");

// owner returns 1 if p, the counters in the connection's slot, are still
// those of the pod that accepted the connection; else 0 (the pod is gone,
// and its slot may hold another pod's counters, or the same pod's added
// again from zero, or the connection is not accepted yet). The agent gives
// a slot a new tenure at each reset, where the pod's id may stay the same.
// Called under p's lock, which the agent's resets take too.
// A number, not p or NULL: a pointer that may be NULL doubled the states
// the verifier walked through egress's counting under the lock.
static __always_inline int owner(const struct pod_stats *p, const struct conn *c)
{
	return p->tenure == c->tenure;
}

// counters_of returns the counters in the connection's slot (see owner).
// Their lock guards the connection's ring even when the pod is gone.
static __always_inline struct pod_stats *counters_of(struct conn *c)
{
	return bpf_map_lookup_elem(&pod_counters, &c->slot);
}

// pending returns the requests in flight on the connection.
static __always_inline __u32 pending(const struct conn *c)
{
	return c->pushed - c->popped;
}

// push_locked counts n requests that started at now, the next n of the
// ring: N and started up by those that are not probes, now added to S for
// each; the proxied counters too when the client is an activator. p is
// the connection's slot, own whether it is still its pod's (else: record
// them, count nothing). Called under p's lock.
static __always_inline void push_locked(struct pod_stats *p, int own, struct conn *c, __u32 n, __u64 now)
{
	__u32 i, slot, counted = 0, first = 0;

	// The oldest request's start time is in the first cache line, which
	// both sides touch anyway: requests one at a time never touch the
	// ring's lines.
	if (n && !pending(c)) {
		c->oldest_ns = now;
		first = 1;
	}
	// Without a branch on the flags: the verifier checks every iteration
	// of a loop under a lock (no bpf_loop there), and branches would
	// multiply its paths.
#pragma clang loop unroll(disable)
	for (i = 0; i < MAX_PIPELINE; i++) {
		if (i >= n)
			break;
		slot = (c->pushed + i) & RING_MASK;
		if (i >= first)
			c->start_ns[slot] = now;
		counted += 1 - ((c->probe_bits >> slot) & 1);
	}
	c->pushed += n;
	if (!own)
		return;
	p->probes_total += n - counted;
	p->all.in_flight += counted;
	p->all.started += counted;
	p->all.start_sum_ns += counted * now;
	if (c->proxied) {
		p->proxied.in_flight += counted;
		p->proxied.started += counted;
		p->proxied.start_sum_ns += counted * now;
	}
}

// pop_locked completes the n oldest requests in flight at now: N down and
// completed up by those that are not probes, their start times taken off
// S and their durations added to C; the proxied counters too. p and own
// as for push_locked. Called under p's lock.
static __always_inline void pop_locked(struct pod_stats *p, int own, struct conn *c, __u32 n, __u64 now)
{
	__u64 starts = 0, took = 0, start, keep;
	__u32 i, slot, counted = 0;
	__s64 d;

	// Without branches on the flags and times (see push_locked): keep is
	// all ones for a request that is load, 0 for a probe.
#pragma clang loop unroll(disable)
	for (i = 0; i < MAX_PIPELINE; i++) {
		if (i >= n)
			break;
		slot = (c->popped + i) & RING_MASK;
		keep = ((c->probe_bits >> slot) & 1) - 1;
		start = c->oldest_ns; // the oldest's is not in the ring (see push_locked)
		if (i)
			start = c->start_ns[slot];
		d = now - start;
		counted += keep & 1;
		starts += start & keep;
		took += d & ~(d >> 63) & keep; // a start after now (clocks of two CPUs) took 0
	}
	c->popped += n;
	if (pending(c))
		c->oldest_ns = c->start_ns[c->popped & RING_MASK];
	if (!own || !counted)
		return;
	p->all.in_flight -= counted;
	p->all.completed += counted;
	p->all.start_sum_ns -= starts;
	p->all.done_sum_ns += took;
	if (c->proxied) {
		p->proxied.in_flight -= counted;
		p->proxied.completed += counted;
		p->proxied.start_sum_ns -= starts;
		p->proxied.done_sum_ns += took;
	}
}

// push_requests counts the n requests the request parser began in a
// segment that arrived at now, unless the connection ended meanwhile.
static __always_inline void push_requests(struct pod_stats *pod, struct conn *c, __u32 n, __u64 now)
{
	if (!pod)
		return; // a slot beyond the array: the agent never writes one
	bpf_spin_lock(&pod->lock);
	if (!c->closed)
		push_locked(pod, owner(pod, c), c, n, now);
	bpf_spin_unlock(&pod->lock);
}

// pop_requests completes up to n of the oldest requests in flight at now:
// those whose responses the response parser found complete.
static __always_inline void pop_requests(struct pod_stats *pod, struct conn *c, __u32 n, __u64 now)
{
	if (!pod)
		return;
	bpf_spin_lock(&pod->lock);
	if (n > pending(c))
		n = pending(c); // responses to requests that were not counted (a lost stream)
	if (!c->closed)
		pop_locked(pod, owner(pod, c), c, n, now);
	bpf_spin_unlock(&pod->lock);
}

// go_opaque switches a connection to connection-level accounting, which is
// decided at its start: from now until it closes it is one request in
// flight, whatever its bytes are. A probe in flight is not load either way;
// a connection without a request in flight gets one.
static __always_inline void go_opaque(struct pod_stats *pod, struct conn *c, __u64 now)
{
	__u32 i, slot, load = 0;
	int own;

	if (!pod)
		return;
	bpf_spin_lock(&pod->lock);
	own = owner(pod, c);
	if (c->opaque || c->closed)
		goto out;
	c->opaque = 1;
#pragma clang loop unroll(disable)
	for (i = 0; i < MAX_PIPELINE; i++) {
		if (i >= pending(c))
			break;
		slot = (c->popped + i) & RING_MASK;
		load |= 1 - ((c->probe_bits >> slot) & 1);
	}
	if (!load && pending(c) < MAX_PIPELINE) {
		c->probe_bits &= ~(1 << (c->pushed & RING_MASK));
		push_locked(pod, own, c, 1, now);
	}
	if (own) {
		pod->opaque_in_flight++;
		pod->opaque_total++;
	}
out:
	bpf_spin_unlock(&pod->lock);
}

// pop_h2_locked completes every stream in flight of an HTTP/2 connection
// (lib/h2.h) at now: their start times are summed in h, not in the ring.
// p and own as for push_locked. Called under p's lock.
static __always_inline void pop_h2_locked(struct pod_stats *p, int own, struct conn *c, struct h2_conn *h, __u64 now)
{
	__u64 n = pending(c), sum = h->start_sum;

	c->popped = c->pushed;
	h->start_sum = 0;
	if (!own || !n)
		return;
	p->all.in_flight -= n;
	p->all.completed += n;
	p->all.start_sum_ns -= sum;
	p->all.done_sum_ns += n * now - sum;
	if (c->proxied) {
		p->proxied.in_flight -= n;
		p->proxied.completed += n;
		p->proxied.start_sum_ns -= sum;
		p->proxied.done_sum_ns += n * now - sum;
	}
}

// close_conn counts the end of a connection at now: the requests still in
// flight complete (a server that closed sends nothing more), and it stops
// counting as a connection. h is the connection's HTTP/2 state, if it
// has one (c->h2 set; NULL for any other).
static __always_inline void close_conn(struct pod_stats *pod, struct conn *c, struct h2_conn *h, __u64 now)
{
	int own;

	if (!pod)
		return;
	bpf_spin_lock(&pod->lock);
	own = owner(pod, c);
	if (c->closed)
		goto out;
	c->closed = 1;
	if (c->h2 && h)
		pop_h2_locked(pod, own, c, h, now); // lib/h2.h sums its start times there
	else
		pop_locked(pod, own, c, pending(c), now);
	if (own) {
		pod->conns_in_flight--;
		if (c->opaque)
			pod->opaque_in_flight--;
		else if (c->h2 == H2_FOLLOW)
			pod->h2_in_flight--;
	}
out:
	bpf_spin_unlock(&pod->lock);
}

#endif
