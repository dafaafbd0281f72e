package endpoints

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

func TestFamilies(t *testing.T) {
	v4, v6 := discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	for _, tc := range []struct {
		name     string
		families []corev1.IPFamily
		want     []discoveryv1.AddressType
	}{
		{"not filled: IPv4, as before IPv6", nil, []discoveryv1.AddressType{v4}},
		{"IPv4", []corev1.IPFamily{corev1.IPv4Protocol}, []discoveryv1.AddressType{v4}},
		{"IPv6", []corev1.IPFamily{corev1.IPv6Protocol}, []discoveryv1.AddressType{v6}},
		{"dual-stack, IPv6 first", []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}, []discoveryv1.AddressType{v6, v4}},
		{"unknown family only", []corev1.IPFamily{"IPv5"}, []discoveryv1.AddressType{v4}},
	} {
		got := Families(&corev1.Service{Spec: corev1.ServiceSpec{IPFamilies: tc.families}})
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}
}

// TestSliceName: IPv4 slices keep the names they had before IPv6, so an
// upgrade rewrites none; IPv6 ones cannot share them (a slice's address
// type cannot change).
func TestSliceName(t *testing.T) {
	for _, tc := range []struct {
		family discoveryv1.AddressType
		i      int
		want   string
	}{
		{discoveryv1.AddressTypeIPv4, 0, "hello-sockscale-0"},
		{discoveryv1.AddressTypeIPv4, 3, "hello-sockscale-3"},
		{discoveryv1.AddressTypeIPv6, 0, "hello-sockscale-v6-0"},
		{discoveryv1.AddressTypeIPv6, 12, "hello-sockscale-v6-12"},
	} {
		if got := SliceName("hello", tc.family, tc.i); got != tc.want {
			t.Errorf("SliceName(hello, %s, %d) = %q, want %q", tc.family, tc.i, got, tc.want)
		}
	}
}

func TestAddrOf(t *testing.T) {
	a := netip.MustParseAddr
	for _, tc := range []struct {
		name   string
		e      Endpoint
		family discoveryv1.AddressType
		want   netip.Addr
		wantOK bool
	}{
		{"dual-stack, IPv4", Endpoint{IP: a("10.0.0.1"), Addrs: []netip.Addr{a("fd00::1"), a("10.0.0.1")}}, discoveryv1.AddressTypeIPv4, a("10.0.0.1"), true},
		{"dual-stack, IPv6", Endpoint{IP: a("10.0.0.1"), Addrs: []netip.Addr{a("10.0.0.1"), a("fd00::1")}}, discoveryv1.AddressTypeIPv6, a("fd00::1"), true},
		{"IPv4-only has no IPv6", Endpoint{IP: a("10.0.0.1"), Addrs: []netip.Addr{a("10.0.0.1")}}, discoveryv1.AddressTypeIPv6, netip.Addr{}, false},
		{"IPv4-mapped is IPv4", Endpoint{Addrs: []netip.Addr{a("::ffff:10.0.0.1")}}, discoveryv1.AddressTypeIPv4, a("10.0.0.1"), true},
		{"IPv4-mapped is no IPv6", Endpoint{Addrs: []netip.Addr{a("::ffff:10.0.0.1")}}, discoveryv1.AddressTypeIPv6, netip.Addr{}, false},
		{"IP alone", Endpoint{IP: a("fd00::2")}, discoveryv1.AddressTypeIPv6, a("fd00::2"), true},
		{"IP alone, other family", Endpoint{IP: a("fd00::2")}, discoveryv1.AddressTypeIPv4, netip.Addr{}, false},
	} {
		got, ok := tc.e.AddrOf(tc.family)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("%s: AddrOf(%s) = %v, %v; want %v, %v", tc.name, tc.family, got, ok, tc.want, tc.wantOK)
		}
	}
}
