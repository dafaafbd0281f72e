package podaddr

import "net/netip"

// Canonical is the address a pod goes by where one address names it (its
// stats records, the controller's keys): its IPv4 address if it has one,
// else its first IPv6 address; invalid for none. A dual-stack pod and an
// IPv4-only one so keep the name they had before sockscale knew IPv6, and
// the choice does not depend on which family the cluster lists first.
// IPv4-mapped addresses are IPv4.
func Canonical(ips []netip.Addr) netip.Addr {
	var first netip.Addr
	for _, ip := range ips {
		ip = ip.Unmap()
		if ip.Is4() {
			return ip
		}
		if !first.IsValid() && ip.IsValid() {
			first = ip
		}
	}
	return first
}
