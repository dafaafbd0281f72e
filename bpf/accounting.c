// SPDX-License-Identifier: (MIT OR GPL-2.0)
//go:build ignore

// In-kernel request accounting for sockscale.
//
// Three programs attach once at a cgroup v2 root and so see the TCP sockets
// of every pod below it (a fourth, sockscale_drain, only the connections of
// leaving pods that the agent hands it):
//
//   sockops          accepts and closes: creates and ends per-connection state
//   cgroup_skb/in    bytes from clients: a request counts from its headers' end
//   cgroup_skb/out   bytes to clients: an HTTP/1.x response parser ends it
//
// Pods are identified by the server socket's local address, IPv4 or IPv6
// (struct ip_addr: one key form for both), through the pod_slots map,
// which the agent fills (a dual-stack pod has a slot per address);
// sock_ops gives each accepted connection of a pod its state in the
// socket's storage, including the slot of the pod's counters. Connections open before the programs were loaded
// (an agent upgrade brings new maps) are adopted by ingress at their next
// client bytes (lib/adopt.h). Any other traffic costs one socket-storage
// miss, and its client bytes on established sockets one pod_slots miss.
//
// Per pod we keep requests in flight (N), the sum of the start times of the
// requests in flight (S) and the sum of the durations of completed requests
// (C). The time integral of N up to time t is then C + N*t - S. The three are
// updated together under the pod's bpf_spin_lock and read together by user
// space with BPF_F_LOCK, so a snapshot is never torn.
//
// Sequence numbers, not packets, drive both directions: cgroup_skb ingress runs
// before TCP's own sequence checks, so it sees retransmitted and out-of-order
// segments, and egress sees retransmissions and GSO super-packets (of any
// size: BIG TCP). Each side remembers the next sequence number it has not
// seen and only ever looks at bytes beyond it, in order; client bytes that
// arrive ahead of a hole are skipped once TCP fills it (by count inside a
// body).
//
// Both directions follow HTTP/1.x messages to their ends (lib/message.h),
// so every request counts, pipelined ones too. Whether a connection is
// HTTP/1.x is decided at its start; a parser that later loses the stream
// (bytes it never saw, a malformed message, one of its limits) waits for a
// point it can prove (a request line, or a status line after the client
// spoke) and follows the stream from there.
//
// Minimum kernel: 5.17 (bpf_loop).
//
// Layout. bpf2go compiles one translation unit per object, so this is the
// only file gen.go names: it holds the licence and includes the rest. The
// concerns live in headers, the way Cilium keeps bpf/lib/*.h, and each
// program in a small entry file of its own; entry files are .c (with
// //go:build ignore, like this one) but are only ever compiled through the
// #includes below. Each file includes what it uses; include guards make the
// repeats free.
//
//   accounting.h     types and limits shared with Go (bpf2go -type, the model)
//   lib/maps.h       the maps the agent fills and reads; event counters
//   lib/ip.h         a segment's IP layer, either family: addresses and the TCP header's offset
//   lib/conn.h       where a connection's state lives and how a segment finds it
//   lib/counters.h   per-pod counters and the request transitions that change them
//   lib/bytes.h      the parse window, tokens, eight-bytes-at-a-time helpers
//   lib/message.h    HTTP/1.x message parser of both directions: where each message ends
//   lib/request.h    client bytes: requests counted, opaque at the start, resynchronising
//   lib/response.h   server bytes: requests completed, resynchronising
//   lib/h2.h         HTTP/2 with prior knowledge: streams counted from their frames
//   lib/segment.h    a TCP segment's new bytes in order, to the request or response side
//   lib/accept.h     a new connection's state, from the bytes it sent before the accept
//   lib/adopt.h      state for connections open before the programs were loaded (an upgrade)
//   sockops.c        program sockscale_sockops (sock_ops)
//   ingress.c        program sockscale_ingress (cgroup_skb ingress)
//   egress.c         program sockscale_egress (cgroup_skb egress)
//   drain.c          program sockscale_drain (sk_msg of the draining sockhash)
//   testprogs.c      programs of the test object only (sockscale_test_accept, sockscale_test_drop)

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "accounting.h"
#include "lib/maps.h"
#include "lib/conn.h"
#include "lib/counters.h"
#include "lib/bytes.h"
#include "lib/message.h"
#include "lib/request.h"
#include "lib/response.h"
#include "lib/h2.h"
#include "lib/accept.h"
#include "lib/adopt.h"
#include "lib/segment.h"

char __license[] SEC("license") = "Dual MIT/GPL";

#include "sockops.c"
#include "ingress.c"
#include "egress.c"
#include "drain.c"

#ifdef SOCKSCALE_TEST_TUPLE
#include "testprogs.c"
#endif
