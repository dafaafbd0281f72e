package svcaddr

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// Why a public Service has no address the kernel can match. The values
// are metric label values of the agent (sockscale_agent_redirect_skipped).
const (
	// NoService: the public Service does not exist (yet).
	NoService = "service_not_found"
	// Headless: the Service has clusterIP None: clients connect to the
	// endpoints' addresses, there is no address to match.
	Headless = "headless"
	// NoClusterIP: the Service has no cluster IP (ExternalName).
	NoClusterIP = "no_cluster_ip"
	// NoTCPPort: the ports that go to the activators are all UDP or SCTP;
	// only TCP connects are redirected.
	NoTCPPort = "no_tcp_port"
)

// Explain says in words what a reason of Redirected means for clients.
func Explain(reason string) string {
	switch reason {
	case NoService:
		return "the public Service does not exist"
	case Headless:
		return "the public Service is headless (clusterIP None): clients connect to its endpoints' addresses, which only the EndpointSlices switch"
	case NoClusterIP:
		return "the public Service has no cluster IP"
	case NoTCPPort:
		return "the public Service's proxied ports are not TCP: the kernel redirects TCP connects only"
	}
	return reason
}

// Redirected returns the addresses of svc whose connects go to the
// activators in Proxy mode, or why there is none: each cluster IP, of
// either family (a dual-stack Service has one of each), on the ports the
// controller sends to the activators (the one numbered port when svc has
// it, else every port, as the Proxy-mode EndpointSlice does), TCP ones
// only; by port, then in the order of spec.clusterIPs. IPv4-mapped
// addresses are given as IPv4. Example: cluster IPs [10.96.0.10, fd00::a],
// ports 80/TCP and 53/UDP, port 0 => [10.96.0.10:80, [fd00::a]:80]; 53/UDP
// keeps kube-proxy's path. An entry needs backends of its address's family
// too, which the caller checks.
func Redirected(svc *corev1.Service, port int32) ([]netip.AddrPort, string) {
	if svc == nil {
		return nil, NoService
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP} // clusterIPs is filled by the API server; tolerate objects without it
	}
	var addrs []netip.Addr
	for _, s := range ips {
		if s == corev1.ClusterIPNone {
			return nil, Headless
		}
		// A zoned or unspecified address is no cluster IP the API server
		// gives out; the kernel map refuses them.
		if ip, err := netip.ParseAddr(s); err == nil && ip.Zone() == "" && !ip.IsUnspecified() && !slices.Contains(addrs, ip.Unmap()) {
			addrs = append(addrs, ip.Unmap())
		}
	}
	if len(addrs) == 0 {
		return nil, NoClusterIP
	}
	var out []netip.AddrPort
	for _, p := range proxiedPorts(svc.Spec.Ports, port) {
		if p.Protocol != corev1.ProtocolTCP && p.Protocol != "" {
			continue // the programs see TCP connects only
		}
		for _, ip := range addrs {
			out = append(out, netip.AddrPortFrom(ip, uint16(p.Port)))
		}
	}
	if len(out) == 0 {
		return nil, NoTCPPort
	}
	return out, ""
}

// proxiedPorts are the Service's ports that the controller sends to the
// activators in Proxy mode: the one numbered port when the Service has it,
// else all of them (the controller's servedPort), so both layers agree.
func proxiedPorts(ports []corev1.ServicePort, port int32) []corev1.ServicePort {
	if port != 0 {
		for _, p := range ports {
			if p.Port == port {
				return []corev1.ServicePort{p}
			}
		}
	}
	return ports
}
