// SPDX-License-Identifier: (MIT OR GPL-2.0)
//go:build ignore

// Program sockscale_ingress: bytes from clients to pods. Included by
// accounting.c, not compiled on its own.
//
// Hook: cgroup_skb ingress at the cgroup v2 root
// (BPF_CGROUP_INET_INGRESS); it runs before TCP's own sequence checks.
// Counts: a request starts with the first new bytes a client sends on an
// idle connection (lib/request.h): requests started and in flight, probes,
// and connections that turn out not to be HTTP/1.x (opaque).
// Minimum kernel: 5.17 (bpf_loop); cmpxchg needs BPF v3 atomics (5.12).

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "lib/segment.h"

// Never drops: always returns 1 (allow).
SEC("cgroup_skb/ingress")
int sockscale_ingress(struct __sk_buff *skb)
{
	return on_segment(skb, 1);
}
