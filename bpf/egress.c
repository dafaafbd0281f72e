// SPDX-License-Identifier: (MIT OR GPL-2.0)
//go:build ignore

// Program sockscale_egress: bytes from pods to clients. Included by
// accounting.c, not compiled on its own.
//
// Hook: cgroup_skb egress at the cgroup v2 root (BPF_CGROUP_INET_EGRESS).
// Counts: a request completes when the HTTP/1.x parser (lib/response.h)
// finds the end of its response: requests completed and their durations;
// a server that speaks first, or a first response that is not HTTP/1.x,
// turns the connection opaque; later failures lose the stream until the
// parser can resynchronise. An adopted connection (lib/adopt.h) ends at
// the server's FIN or RST.
// Minimum kernel: 5.17 (bpf_loop).

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "lib/segment.h"

// Never drops: always returns 1 (allow).
SEC("cgroup_skb/egress")
int sockscale_egress(struct __sk_buff *skb)
{
	return on_segment(skb, 0);
}
