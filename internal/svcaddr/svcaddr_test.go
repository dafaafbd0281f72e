package svcaddr

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

func TestRedirected(t *testing.T) {
	svc := func(ips []string, ports ...corev1.ServicePort) *corev1.Service {
		return &corev1.Service{Spec: corev1.ServiceSpec{ClusterIPs: ips, Ports: ports}}
	}
	tcp := func(port int32) corev1.ServicePort {
		return corev1.ServicePort{Port: port, Protocol: corev1.ProtocolTCP}
	}
	udp := corev1.ServicePort{Port: 53, Protocol: corev1.ProtocolUDP}
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		name       string
		svc        *corev1.Service
		port       int32
		want       []netip.AddrPort
		wantReason string
	}{
		{name: "IPv4", svc: svc([]string{"10.96.0.10"}, tcp(80)), want: []netip.AddrPort{ap("10.96.0.10:80")}},
		{name: "IPv6", svc: svc([]string{"fd5c:a1e:96::a"}, tcp(80)), want: []netip.AddrPort{ap("[fd5c:a1e:96::a]:80")}},
		{
			name: "dual-stack, every port, TCP only", svc: svc([]string{"10.96.0.10", "fd5c:a1e:96::a"}, tcp(80), udp, tcp(443)),
			want: []netip.AddrPort{ap("10.96.0.10:80"), ap("[fd5c:a1e:96::a]:80"), ap("10.96.0.10:443"), ap("[fd5c:a1e:96::a]:443")},
		},
		{
			name: "dual-stack, IPv6 first, the numbered port", svc: svc([]string{"fd5c:a1e:96::a", "10.96.0.10"}, tcp(80), tcp(443)), port: 443,
			want: []netip.AddrPort{ap("[fd5c:a1e:96::a]:443"), ap("10.96.0.10:443")},
		},
		{name: "IPv4-mapped is IPv4", svc: svc([]string{"::ffff:10.96.0.10"}, tcp(80)), want: []netip.AddrPort{ap("10.96.0.10:80")}},
		{name: "clusterIP without clusterIPs", svc: &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: "fd5c:a1e:96::a", Ports: []corev1.ServicePort{tcp(80)}}}, want: []netip.AddrPort{ap("[fd5c:a1e:96::a]:80")}},
		{name: "protocol unset is TCP", svc: svc([]string{"fd5c:a1e:96::a"}, corev1.ServicePort{Port: 8080}), want: []netip.AddrPort{ap("[fd5c:a1e:96::a]:8080")}},
		{name: "an unparsable address is skipped", svc: svc([]string{"garbage", "fd5c:a1e:96::a"}, tcp(80)), want: []netip.AddrPort{ap("[fd5c:a1e:96::a]:80")}},
		{name: "missing", svc: nil, wantReason: NoService},
		{name: "headless", svc: svc([]string{corev1.ClusterIPNone}, tcp(80)), wantReason: Headless},
		{name: "no cluster IP", svc: svc(nil, tcp(80)), wantReason: NoClusterIP},
		{name: "only unusable addresses", svc: svc([]string{"::", "garbage"}, tcp(80)), wantReason: NoClusterIP},
		{name: "UDP only", svc: svc([]string{"10.96.0.10", "fd5c:a1e:96::a"}, udp), wantReason: NoTCPPort},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, reason := Redirected(tc.svc, tc.port)
			if reason != tc.wantReason {
				t.Errorf("reason %q, want %q", reason, tc.wantReason)
			}
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
				t.Errorf("addresses (-want +got):\n%s", diff)
			}
		})
	}
}

// TestExplain: every reason has its sentence.
func TestExplain(t *testing.T) {
	for _, reason := range []string{NoService, Headless, NoClusterIP, NoTCPPort} {
		if got := Explain(reason); got == reason || got == "" {
			t.Errorf("Explain(%q) = %q, want a sentence", reason, got)
		}
	}
}
