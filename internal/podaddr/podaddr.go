package podaddr

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
)

// All returns the pod's addresses in the order of status.podIPs (podIP
// alone for an object that predates podIPs), IPv4-mapped IPv6 ones as
// plain IPv4, each once. Unparsable entries are skipped: the kubelet
// writes valid addresses, and a pod without one is not reachable anyway.
func All(status *corev1.PodStatus) []netip.Addr {
	var out []netip.Addr
	add := func(s string) {
		ip, err := netip.ParseAddr(s)
		if err != nil || ip.Zone() != "" {
			return
		}
		ip = ip.Unmap()
		for _, seen := range out {
			if seen == ip {
				return
			}
		}
		out = append(out, ip)
	}
	for _, p := range status.PodIPs {
		add(p.IP)
	}
	if len(out) == 0 {
		add(status.PodIP)
	}
	return out
}

// Canonical returns the address that identifies the pod: its first IPv4
// address, else its first IPv6 one; false when it has none yet.
func Canonical(status *corev1.PodStatus) (netip.Addr, bool) {
	a := Pick(All(status))
	return a, a.IsValid()
}

// Pick returns the canonical one of a pod's addresses: the first IPv4,
// else the first IPv6 (IPv4-mapped ones count as IPv4); the zero Addr
// when addrs has no valid address.
func Pick(addrs []netip.Addr) netip.Addr {
	var v6 netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		switch {
		case a.Is4():
			return a
		case a.Is6() && !v6.IsValid():
			v6 = a
		}
	}
	return v6
}
