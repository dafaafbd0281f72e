package endpoints

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Families are the address types of the EndpointSlices sockscale writes
// for svc: one per family of spec.ipFamilies, in its order (an
// EndpointSlice holds addresses of one family, and kube-proxy programs
// each family of a Service from the slices of that family). A Service
// that names none (an object the API server did not fill) gets IPv4,
// what sockscale wrote before it knew IPv6.
func Families(svc *corev1.Service) []discoveryv1.AddressType {
	var out []discoveryv1.AddressType
	for _, f := range svc.Spec.IPFamilies {
		switch f {
		case corev1.IPv4Protocol:
			out = append(out, discoveryv1.AddressTypeIPv4)
		case corev1.IPv6Protocol:
			out = append(out, discoveryv1.AddressTypeIPv6)
		}
	}
	if len(out) == 0 {
		out = []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4}
	}
	return out
}

// SliceName names the i-th EndpointSlice of family of Service service
// that sockscale writes: <service>-sockscale-<i> for IPv4, the names
// slices had before IPv6 (so an upgrade rewrites none), and
// <service>-sockscale-v6-<i> for IPv6 (a slice's address type cannot
// change, so the families cannot share names).
func SliceName(service string, family discoveryv1.AddressType, i int) string {
	if family == discoveryv1.AddressTypeIPv6 {
		return fmt.Sprintf("%s-sockscale-v6-%d", service, i)
	}
	return fmt.Sprintf("%s-sockscale-%d", service, i)
}

// FamilyOf is the address type of a's family (IPv4-mapped IPv6 counts as
// IPv4, as Kubernetes never writes it).
func FamilyOf(a netip.Addr) discoveryv1.AddressType {
	if a.Unmap().Is4() {
		return discoveryv1.AddressTypeIPv4
	}
	return discoveryv1.AddressTypeIPv6
}

// AddrOf returns e's address of family, false when it has none (an
// IPv4-only activator in an IPv6 slice).
func (e Endpoint) AddrOf(family discoveryv1.AddressType) (netip.Addr, bool) {
	for _, a := range e.Addrs {
		if FamilyOf(a) == family {
			return a.Unmap(), true
		}
	}
	if len(e.Addrs) == 0 && e.IP.IsValid() && FamilyOf(e.IP) == family {
		return e.IP.Unmap(), true
	}
	return netip.Addr{}, false
}
