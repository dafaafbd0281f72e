package socktable

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func sock(family uint8, state State, local, remote string) Socket {
	return Socket{Family: family, State: state, Local: netip.MustParseAddrPort(local), Remote: netip.MustParseAddrPort(remote)}
}

func TestServerConns(t *testing.T) {
	v4Listen := sock(FamilyIPv4, Listen, "10.0.0.2:8080", "0.0.0.0:0")
	v4Wild := sock(FamilyIPv4, Listen, "0.0.0.0:8080", "0.0.0.0:0")
	v6Wild := sock(FamilyIPv6, Listen, "[::]:8080", "[::]:0")
	v6WildOnly := v6Wild
	v6WildOnly.V6Only = true
	// Connections to port 8080 of 10.0.0.2, and the pod's own outbound one.
	in4 := sock(FamilyIPv4, Established, "10.0.0.2:8080", "10.0.0.1:40000")
	in4On6 := sock(FamilyIPv6, Established, "10.0.0.2:8080", "10.0.0.1:40001") // accepted by [::]
	in4CloseWait := sock(FamilyIPv4, CloseWait, "10.0.0.2:8080", "10.0.0.1:40002")
	in6 := sock(FamilyIPv6, Established, "[fd00::2]:8080", "[fd00::1]:40003")
	otherAddr := sock(FamilyIPv4, Established, "10.0.0.3:8080", "10.0.0.1:40004")
	out := sock(FamilyIPv4, Established, "10.0.0.2:41000", "10.0.0.1:8080")
	var closing []Socket
	for _, st := range []State{SynSent, SynRecv, FinWait1, FinWait2, TimeWait, Close, LastAck, Closing, NewSynRecv} {
		closing = append(closing, sock(FamilyIPv4, st, "10.0.0.2:8080", "10.0.0.1:40005"))
	}
	conns := []Socket{in4, in4On6, in4CloseWait, in6, otherAddr, out}

	tests := []struct {
		name  string
		socks []Socket
		want  []Socket
	}{
		{name: "nothing listens", socks: conns, want: nil},
		{name: "listener on the address", socks: append([]Socket{v4Listen}, conns...),
			want: []Socket{in4, in4On6, in4CloseWait}},
		{name: "0.0.0.0 covers every IPv4 address, not IPv6", socks: append(conns, v4Wild),
			want: []Socket{in4, in4On6, in4CloseWait, otherAddr}},
		{name: "[::] covers IPv4 too", socks: append(conns, v6Wild),
			want: []Socket{in4, in4On6, in4CloseWait, in6, otherAddr}},
		{name: "[::] v6-only covers IPv6 only", socks: append(conns, v6WildOnly),
			want: []Socket{in6}},
		{name: "listener on another port", socks: append(conns, sock(FamilyIPv4, Listen, "0.0.0.0:9090", "0.0.0.0:0")), want: nil},
		{name: "states that are not open", socks: append(closing, v4Wild), want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, ServerConns(tt.socks), equateAddrs); diff != "" {
				t.Errorf("ServerConns (-want +got):\n%s", diff)
			}
		})
	}
}

func TestStateString(t *testing.T) {
	for st, want := range map[State]string{Established: "ESTABLISHED", CloseWait: "CLOSE_WAIT", Listen: "LISTEN", BoundInactive: "BOUND_INACTIVE", 0: "STATE(0)", 99: "STATE(99)"} {
		if got := st.String(); got != want {
			t.Errorf("State(%d) = %q, want %q", uint8(st), got, want)
		}
	}
}

// TestDumpedStates pins the mask Dump asks the kernel for: every TCP state
// but TIME_WAIT, NEW_SYN_RECV and BOUND_INACTIVE.
func TestDumpedStates(t *testing.T) {
	for st := State(0); st < 16; st++ {
		want := st >= Established && st <= Closing && st != TimeWait
		if got := dumpedStates&(1<<st) != 0; got != want {
			t.Errorf("%v dumped = %v, want %v", st, got, want)
		}
	}
}

// TestServerSideStates pins the mask DumpServerSide asks the kernel for:
// the states ServerConns looks at, and no other.
func TestServerSideStates(t *testing.T) {
	for st := State(0); st < 16; st++ {
		want := st == Established || st == CloseWait || st == Listen
		if got := serverSideStates&(1<<st) != 0; got != want {
			t.Errorf("%v dumped = %v, want %v", st, got, want)
		}
	}
}
