package podaddr

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
)

func status(podIP string, podIPs ...string) *corev1.PodStatus {
	s := &corev1.PodStatus{PodIP: podIP}
	for _, ip := range podIPs {
		s.PodIPs = append(s.PodIPs, corev1.PodIP{IP: ip})
	}
	return s
}

func TestCanonicalAndAll(t *testing.T) {
	addr := netip.MustParseAddr
	for _, tc := range []struct {
		name      string
		status    *corev1.PodStatus
		want      netip.Addr
		wantAll   []netip.Addr
		wantValid bool
	}{
		{"no address yet", status(""), netip.Addr{}, nil, false},
		{"IPv4 only", status("10.0.0.5", "10.0.0.5"), addr("10.0.0.5"), []netip.Addr{addr("10.0.0.5")}, true},
		{"podIP without podIPs", status("10.0.0.5"), addr("10.0.0.5"), []netip.Addr{addr("10.0.0.5")}, true},
		{"IPv6 only", status("fd00::5", "fd00::5"), addr("fd00::5"), []netip.Addr{addr("fd00::5")}, true},
		{"dual-stack, IPv4 first", status("10.0.0.5", "10.0.0.5", "fd00::5"), addr("10.0.0.5"),
			[]netip.Addr{addr("10.0.0.5"), addr("fd00::5")}, true},
		// An IPv6-primary dual-stack cluster lists IPv6 first: the pod is
		// still known by its IPv4 address, as the agents report it.
		{"dual-stack, IPv6 first", status("fd00::5", "fd00::5", "10.0.0.5"), addr("10.0.0.5"),
			[]netip.Addr{addr("fd00::5"), addr("10.0.0.5")}, true},
		{"IPv4-mapped is IPv4", status("::ffff:10.0.0.5", "::ffff:10.0.0.5"), addr("10.0.0.5"), []netip.Addr{addr("10.0.0.5")}, true},
		{"garbage skipped", status("x", "x", "fd00::7"), addr("fd00::7"), []netip.Addr{addr("fd00::7")}, true},
		{"zone refused", status("fe80::1%eth0", "fe80::1%eth0"), netip.Addr{}, nil, false},
		{"duplicates once", status("10.0.0.5", "10.0.0.5", "10.0.0.5"), addr("10.0.0.5"), []netip.Addr{addr("10.0.0.5")}, true},
	} {
		got, ok := Canonical(tc.status)
		if got != tc.want || ok != tc.wantValid {
			t.Errorf("%s: Canonical = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.wantValid)
		}
		if diff := cmp.Diff(tc.wantAll, All(tc.status), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
			t.Errorf("%s: All (-want +got):\n%s", tc.name, diff)
		}
	}
}
