package localroute

import (
	"errors"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

func TestRules(t *testing.T) {
	local := Route{Dst: netip.MustParseAddr("10.244.0.1"), Type: unix.RTN_LOCAL, Dev: "lo"}
	bridged := Route{Dst: netip.MustParseAddr("10.244.1.5"), Type: unix.RTN_UNICAST, Dev: "sccl-node-a"}
	away := Route{Dst: netip.MustParseAddr("10.96.0.9"), Type: unix.RTN_UNICAST, Dev: "eth0", Gateway: netip.MustParseAddr("172.17.0.1")}
	for _, tc := range []struct {
		rule Rule
		r    Route
		want bool
	}{
		{Local(), local, true},
		{Local(), bridged, false},
		{Loopback(), local, true},
		{Loopback(), Route{Type: unix.RTN_LOCAL, Dev: "sccl-host"}, false},
		{Loopback(), Route{Type: unix.RTN_UNICAST, Dev: "lo"}, false},
		{Dev("sccl-node-a"), bridged, true},
		{Dev("sccl-node"), bridged, false},
		{DevPrefix("sccl"), bridged, true},
		{DevPrefix("sccl"), local, false},
		{DevPrefix("sccl"), away, false},
		{Local(), away, false},
	} {
		if got := tc.rule.ok(tc.r); got != tc.want {
			t.Errorf("%s accepts %q: %v, want %v", tc.rule, tc.r, got, tc.want)
		}
	}
	if got, want := away.String(), "10.96.0.9 via 172.17.0.1 dev eth0"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

// The loopback addresses are local for every user: the lookup needs no
// privileges.
func TestCheckLoopback(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	r, err := Get(lo)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Local() || r.Dev != "lo" {
		t.Fatalf("route to %s: %q, want local through lo", lo, r)
	}
	if err := Check(lo, Loopback()); err != nil {
		t.Error(err)
	}
	if err := Check(lo, Dev("no-such-link")); !errors.Is(err, ErrNotLocal) {
		t.Errorf("Check(%s, Dev(no-such-link)) = %v, want ErrNotLocal", lo, err)
	}
}
