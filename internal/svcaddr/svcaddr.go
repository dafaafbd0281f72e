package svcaddr

import (
	"net/netip"

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
	// NoIPv4: the Service has only IPv6 cluster IPs; the kernel map takes
	// IPv4 addresses only.
	NoIPv4 = "no_ipv4_cluster_ip"
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
	case NoIPv4:
		return "the public Service has no IPv4 cluster IP: the kernel redirects IPv4 connects only"
	case NoTCPPort:
		return "the public Service's proxied ports are not TCP: the kernel redirects TCP connects only"
	}
	return reason
}

// Redirected returns the addresses of svc whose connects go to the
// activators in Proxy mode, or why there is none: each IPv4 cluster IP on
// the ports the controller sends to the activators (the one numbered port
// when svc has it, else every port, as the Proxy-mode EndpointSlice does),
// TCP ones only. Example: cluster IPs [10.96.0.10, fd00::a], ports 80/TCP
// and 53/UDP, port 0 => [10.96.0.10:80]; the IPv6 address and 53/UDP keep
// kube-proxy's path.
func Redirected(svc *corev1.Service, port int32) ([]netip.AddrPort, string) {
	if svc == nil {
		return nil, NoService
	}
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP} // clusterIPs is filled by the API server; tolerate objects without it
	}
	var v4 []netip.Addr
	for _, s := range ips {
		if s == corev1.ClusterIPNone {
			return nil, Headless
		}
		if ip, err := netip.ParseAddr(s); err == nil && ip.Unmap().Is4() {
			v4 = append(v4, ip.Unmap())
		}
	}
	if len(ips) == 0 {
		return nil, NoClusterIP
	}
	if len(v4) == 0 {
		return nil, NoIPv4
	}
	var out []netip.AddrPort
	for _, p := range proxiedPorts(svc.Spec.Ports, port) {
		if p.Protocol != corev1.ProtocolTCP && p.Protocol != "" {
			continue // the programs see TCP connects only
		}
		for _, ip := range v4 {
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
