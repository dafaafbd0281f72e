// SPDX-License-Identifier: (MIT OR GPL-2.0)
//go:build ignore

// Program sockscale_ingress: bytes from clients to pods. Included by
// accounting.c, not compiled on its own.
//
// Hook: cgroup_skb ingress at the cgroup v2 root
// (BPF_CGROUP_INET_INGRESS); it runs before TCP's own sequence checks, and
// for bytes that reach a pod's listening socket (before the accept).
// Counts: a request starts with its first bytes (lib/request.h), one for
// each request line the HTTP/1.x parser follows (pipelined ones too):
// requests started and in flight, probes, and connections whose first
// bytes are not HTTP/1.x (opaque); lost streams and resynchronisations;
// connections open before it was loaded, adopted at their next bytes
// (lib/adopt.h), and their end at a client's RST.
// Minimum kernel: 5.17 (bpf_loop).

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "lib/segment.h"

// Never drops: always returns 1 (allow).
SEC("cgroup_skb/ingress")
int sockscale_ingress(struct __sk_buff *skb)
{
	return on_segment(skb, 1);
}
