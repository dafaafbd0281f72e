// SPDX-License-Identifier: (MIT OR GPL-2.0)
// The IP layer of a TCP segment, of either family: its addresses as the
// maps key them (struct ip_addr, accounting.h) and where its TCP header
// starts. Everything above this layer is the same for IPv4 and IPv6.

#ifndef SOCKSCALE_LIB_IP_H
#define SOCKSCALE_LIB_IP_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "../accounting.h"
#include "maps.h"

// A segment's source and destination addresses.
struct seg_ips {
	struct ip_addr saddr;
	struct ip_addr daddr;
};

// load_header copies the 20-byte IP or TCP header at off into dst: straight
// from the packet's linear part when it is there (headers nearly always
// are), else through the helper. Returns 0 on success.
#define HEADER_LEN 20
_Static_assert(sizeof(struct iphdr) == HEADER_LEN, "header size");
static __always_inline int load_header(struct __sk_buff *skb, __u32 off, void *dst)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	// off is at most 60 (ihl * 4): bounded, so the verifier can check it.
	if (off <= 60 && data + off + HEADER_LEN <= data_end) {
		// Copied in 2-byte units: from a void pointer clang copies byte by
		// byte (120 instructions for the two headers). Not in 4-byte
		// units: headers may sit at 2-byte boundaries, and where unaligned
		// loads are slow (riscv64) the verifier refuses them.
		__builtin_memcpy((__u16 *)dst, (const __u16 *)(data + off), HEADER_LEN);
		return 0;
	}
	// Zeroed first only for the verifier. When this path reaches a state it
	// already checked through the branch above, it carries over the
	// precision the header's bytes needed there (they went through
	// registers) and traces it back along this path, which needs a store to
	// stop at: the helper's write is none, and Linux 6.18 then walked on
	// into a state without a stack and refused the program ("verifier bug:
	// stack slot 15, total slots 0"). Whether that happens depends on
	// on_segment's stack layout; the stores cost only this rare path.
	__builtin_memset(dst, 0, HEADER_LEN);
	return bpf_skb_load_bytes(skb, off, dst, HEADER_LEN);
}

// The fixed IPv6 header, and the one extension header a TCP segment of a
// pod may carry: hop-by-hop options (a jumbo payload length), at most
// IPV6_HBH_MAX bytes. Segments with other extension headers (routing,
// destination options, fragments) are not followed; pods' TCP has none.
#define IPV6_HDR_LEN 40
#define IPV6_HBH_MAX 16

// load_ips reads the addresses of skb's IP header (at the front of the
// packet, as cgroup_skb sees it) into ips. Returns the offset of its TCP
// header, or 0 if the segment is not TCP over IPv4 or IPv6.
static __always_inline __u32 load_ips(struct __sk_buff *skb, struct seg_ips *ips)
{
	struct iphdr ip;
	struct {
		__u8 next;
		__u8 len; // in 8-byte units, not counting the first 8
	} hbh;
	__u8 next;

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		if (load_header(skb, 0, &ip))
			return 0;
		if (ip.version != 4 || ip.protocol != IPPROTO_TCP || ip.ihl < 5)
			return 0;
		ip_addr_v4(&ips->saddr, ip.saddr);
		ip_addr_v4(&ips->daddr, ip.daddr);
		return ip.ihl * 4;
	}
	if (skb->protocol != bpf_htons(ETH_P_IPV6))
		return 0;
	// The next-header byte and the two addresses, in two helper calls:
	// the fixed header is 40 bytes, twice load_header's.
	if (bpf_skb_load_bytes(skb, __builtin_offsetof(struct ipv6hdr, nexthdr), &next, 1) ||
	    bpf_skb_load_bytes(skb, __builtin_offsetof(struct ipv6hdr, saddr), ips, sizeof(*ips)))
		return 0;
	if (next == IPPROTO_TCP)
		return IPV6_HDR_LEN;
	if (next != IPPROTO_HOPOPTS)
		return 0;
	if (bpf_skb_load_bytes(skb, IPV6_HDR_LEN, &hbh, sizeof(hbh)))
		return 0;
	if (hbh.next != IPPROTO_TCP || (hbh.len + 1) * 8 > IPV6_HBH_MAX)
		return 0;
	return IPV6_HDR_LEN + (hbh.len + 1) * 8;
}

#endif
