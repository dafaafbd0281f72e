package podaddr

import (
	"net/netip"
	"testing"
)

func TestCanonical(t *testing.T) {
	a := netip.MustParseAddr
	tests := []struct {
		name string
		ips  []netip.Addr
		want netip.Addr
	}{
		{"none", nil, netip.Addr{}},
		{"IPv4 only", []netip.Addr{a("10.244.1.5")}, a("10.244.1.5")},
		{"IPv6 only", []netip.Addr{a("fd5c:a1e:0:1::5")}, a("fd5c:a1e:0:1::5")},
		{"dual-stack, IPv4 first", []netip.Addr{a("10.244.1.5"), a("fd5c:a1e:0:1::5")}, a("10.244.1.5")},
		{"dual-stack, IPv6 first: still IPv4", []netip.Addr{a("fd5c:a1e:0:1::5"), a("10.244.1.5")}, a("10.244.1.5")},
		{"IPv4-mapped is IPv4, unmapped", []netip.Addr{a("fd5c:a1e:0:1::5"), a("::ffff:10.244.1.5")}, a("10.244.1.5")},
		{"the first IPv6 of two", []netip.Addr{a("fd5c:a1e:0:1::5"), a("fd5c:a1e:0:1::6")}, a("fd5c:a1e:0:1::5")},
		{"an invalid entry is skipped", []netip.Addr{{}, a("fd5c:a1e:0:1::6")}, a("fd5c:a1e:0:1::6")},
	}
	for _, tt := range tests {
		if got := Canonical(tt.ips); got != tt.want {
			t.Errorf("%s: Canonical(%v) = %v, want %v", tt.name, tt.ips, got, tt.want)
		}
	}
}
