// SPDX-License-Identifier: (MIT OR GPL-2.0)
//go:build ignore

// Programs only in the test object (accountingtest, SOCKSCALE_TEST_TUPLE).
// Included by accounting.c, not compiled on its own.
//
// sockscale_test_accept (cgroup_skb, run by BPF_PROG_TEST_RUN): what
// sock_ops does when a connection is established, which a test run cannot
// do: the prog tests run it with a crafted segment of the connection.
//
// sockscale_test_drop (tc): the real-kernel tests attach it to the pod's
// end of a test pod's link to lose chosen TCP segments on their way to the
// pod, once each, so that what follows them (a later segment before a
// retransmission, data that completes the handshake) happens for certain.
// Counts nothing; drops what drop_rules says.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "accounting.h"
#include "lib/accept.h"
#include "lib/conn.h"
#include "lib/h2.h"
#include "lib/ip.h"
#include "lib/maps.h"

// Establishes the connection of a crafted segment from the client (its
// sequence number is the client's next, its ACK the server's) in conns, as
// on_established does in socket storage; with the bytes the stash holds
// for it, whatever their length. Returns 1.
SEC("cgroup_skb/ingress")
int sockscale_test_accept(struct __sk_buff *skb)
{
	struct conn c = {}, *s, *init, *stored;
	struct h2_conn *h2 = NULL;
	struct conn_key key;
	struct pod_stats *p;
	struct tcphdr tcp;
	struct seg_ips ip;
	__u32 *slot, off;

	off = load_ips(skb, &ip);
	if (!off || bpf_skb_load_bytes(skb, off, &tcp, sizeof(tcp)))
		return 1;
	key.pod_ip = ip.daddr;
	key.peer_ip = ip.saddr;
	key.pod_port = tcp.dest;
	key.peer_port = tcp.source;
	slot = bpf_map_lookup_elem(&pod_slots, &key.pod_ip);
	if (!slot)
		return 1;
	p = bpf_map_lookup_elem(&pod_counters, slot);
	if (!p || !p->id)
		return 1;
	s = bpf_map_lookup_elem(&stash, &key);
	init = first_state(&c, s, *slot, peer_kind(&key.peer_ip), bpf_ntohl(tcp.seq), bpf_ntohl(tcp.ack_seq), s ? 1 : 0);
	if (s && init == s && s->h2 == H2_FOLLOW)
		h2 = h2_accept_stash(NULL, &key, s);
	// As socket storage does: a state that is there already (adopted by
	// ingress, adopt.h) stays.
	bpf_map_update_elem(&conns, &key, init, BPF_NOEXIST);
	if (s)
		bpf_map_delete_elem(&stash, &key);
	stored = bpf_map_lookup_elem(&conns, &key);
	if (stored)
		count_accepted(p, stored, h2, &key.pod_ip);
	return 1;
}

// Which segments to drop: those to port with payload bytes of payload.
struct drop_rule {
	__u16 port;    // TCP destination port, host order
	__u16 payload; // payload length; 0 drops a bare ACK (no SYN, FIN or RST)
	__u32 count;   // how many more to drop
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);              // 0
	__type(value, struct drop_rule); // set by the test
} drop_rules SEC(".maps");

// Returns TC_ACT_SHOT for a segment to drop, else TC_ACT_OK.
SEC("tc")
int sockscale_test_drop(struct __sk_buff *skb)
{
	struct drop_rule *rule;
	struct ipv6hdr ip6;
	struct tcphdr tcp;
	struct iphdr ip;
	__u32 zero = 0, payload, hlen, total;

	rule = bpf_map_lookup_elem(&drop_rules, &zero);
	if (!rule || !rule->count)
		return TC_ACT_OK; // NULL only in theory: an array of one
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) || ip.protocol != IPPROTO_TCP)
			return TC_ACT_OK;
		hlen = ip.ihl * 4;
		total = bpf_ntohs(ip.tot_len);
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)) || ip6.nexthdr != IPPROTO_TCP)
			return TC_ACT_OK;
		hlen = sizeof(ip6);
		total = sizeof(ip6) + bpf_ntohs(ip6.payload_len);
	} else {
		return TC_ACT_OK;
	}
	if (bpf_skb_load_bytes(skb, ETH_HLEN + hlen, &tcp, sizeof(tcp)))
		return TC_ACT_OK;
	if (bpf_ntohs(tcp.dest) != rule->port)
		return TC_ACT_OK;
	payload = total - hlen - tcp.doff * 4;
	if (payload != rule->payload)
		return TC_ACT_OK;
	if (!payload && (tcp.syn || tcp.fin || tcp.rst || !tcp.ack))
		return TC_ACT_OK;
	__sync_fetch_and_add(&rule->count, -1);
	return TC_ACT_SHOT;
}
