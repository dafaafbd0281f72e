package socktable

import (
	"cmp"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/cilium/ebpf"
	gocmp "github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// unknownRequestType is a sock_diag message type no kernel handles: it
// stands in for TCPDIAG_GETSOCK on a kernel that has dropped it, and is
// refused the same way (EINVAL).
const unknownRequestType = 22

// withoutLegacy runs f as on a kernel without the legacy request, and then
// puts things back as they were.
func withoutLegacy(t testing.TB, f func()) {
	t.Helper()
	typ, refused := legacyRequestType, legacyRefused.Load()
	legacyRequestType = unknownRequestType
	legacyRefused.Store(false)
	defer func() {
		legacyRequestType = typ
		legacyRefused.Store(refused)
	}()
	f()
}

func byCookie(socks []Socket) []Socket {
	return slices.SortedFunc(slices.Values(socks), func(a, b Socket) int { return cmp.Compare(a.Cookie, b.Cookie) })
}

// mixedNamespace is a pod namespace with sockets of both families in
// several states: IPv4 connections accepted by an IPv4 listener and by a
// dual-stack one, an IPv6 connection over ::1 (both ends the pod's), a
// v6-only listener, the pod's own outbound connection, a connection the
// client closed (CLOSE_WAIT), one the server closed (FIN_WAIT2), a
// request not yet accepted (SYN_RECV); some with sk_storage values.
func mixedNamespace(t *testing.T, n byte) (*pair, *ebpf.Map, uint32) {
	t.Helper()
	p := newPair(t, "", n)
	ln4, acc4 := listen(t, p.pod, "tcp4", netip.AddrPortFrom(p.podAddr, 8080).String())
	_, accDual := listen(t, p.pod, "tcp", "[::]:8081")
	listen(t, p.pod, "tcp6", "[::]:8082")
	ln6, acc6 := listen(t, p.pod, "tcp6", "[::1]:8083")
	deferred, _ := listen(t, p.pod, "tcp4", netip.AddrPortFrom(p.podAddr, 8084).String())
	if err := connFD(deferred.(*net.TCPListener), func(fd int) {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, 30); err != nil {
			t.Fatal(err)
		}
	}); err != nil {
		t.Fatal(err)
	}

	clients := dial(t, p.peer, ln4.Addr().String(), 3)
	servers := take(t, acc4, 3)
	dial(t, p.peer, netip.AddrPortFrom(p.podAddr, 8081).String(), 2)
	servers = append(servers, take(t, accDual, 2)...)
	dial(t, p.pod, ln6.Addr().String(), 1)
	servers = append(servers, take(t, acc6, 1)...)
	outLn, outAcc := listen(t, p.peer, "tcp4", netip.AddrPortFrom(p.peerAddr, 9090).String())
	dial(t, p.pod, outLn.Addr().String(), 1)
	take(t, outAcc, 1)
	req := dial(t, p.peer, deferred.Addr().String(), 1)[0]

	m, id := newSkStorage(t, "sockscale_mix")
	for i, c := range servers[:4] {
		var uerr error
		if err := connFD(c.(syscall.Conn), func(fd int) { uerr = m.Update(uint32(fd), uint64(i+1), ebpf.UpdateAny) }); err != nil || uerr != nil {
			t.Fatalf("update the socket's storage: %v %v", err, uerr)
		}
	}
	clients[0].Close()
	servers[1].Close()
	waitFor(t, "CLOSE_WAIT, FIN_WAIT2 and SYN_RECV", func() bool {
		socks := byEnds(t, dump(t, p.podNS))
		return socks[endsOf(servers[0])].State == CloseWait && socks[endsOf(servers[1])].State == FinWait2 &&
			socks[ends{endsOf(req).Remote, endsOf(req).Local}].State == SynRecv
	})
	return p, m, id
}

// TestKernelLegacyDump: this kernel takes the legacy request, and its
// answer is the same sockets, all fields alike, as the two requests by
// family give.
func TestKernelLegacyDump(t *testing.T) {
	testenv.RequireRoot(t)
	p, m, _ := mixedNamespace(t, 20)
	if legacyRefused.Load() {
		t.Fatal("this kernel refused the legacy request")
	}
	legacy := dump(t, p.podNS, m.FD())
	if legacyRefused.Load() {
		t.Fatal("this kernel refused the legacy request")
	}
	var byFamily []Socket
	withoutLegacy(t, func() { byFamily = dump(t, p.podNS, m.FD()) })
	if diff := gocmp.Diff(byCookie(byFamily), byCookie(legacy), equateAddrs); diff != "" {
		t.Errorf("sockets by family (-) and in one legacy request (+):\n%s", diff)
	}
	families, states, stored := map[uint8]int{}, map[State]int{}, 0
	for _, s := range legacy {
		families[s.Family]++
		states[s.State]++
		if s.Storage != nil {
			stored++
		}
	}
	if families[FamilyIPv4] == 0 || families[FamilyIPv6] == 0 || states[CloseWait] != 1 || states[FinWait2] != 1 || states[SynRecv] != 1 || stored != 3 {
		t.Errorf("families %v, states %v, %d with storage: want both families, one each of CLOSE_WAIT, FIN_WAIT2 and SYN_RECV, 3 with storage; sockets %v",
			families, states, stored, legacy)
	}
}

// TestKernelDumpFallsBack: on a kernel that refuses the legacy request,
// Dump asks by family instead and keeps doing so; a refusal that the
// requests by family get too (a map that is no sk_storage) is returned
// and does not count as the kernel's lacking the legacy request.
func TestKernelDumpFallsBack(t *testing.T) {
	testenv.RequireRoot(t)
	p := newPair(t, "", 21)
	_, accepted := listen(t, p.pod, "tcp", "[::]:8080")
	dial(t, p.peer, netip.AddrPortFrom(p.podAddr, 8080).String(), 3)
	servers := take(t, accepted, 3)
	arr, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer arr.Close()
	want := dump(t, p.podNS)

	withoutLegacy(t, func() {
		_, err := Dump(p.podNS, []int{arr.FD()})
		if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), p.podNS.String()) || !errors.Is(err, unix.EINVAL) {
			t.Errorf("Dump with an array map: err = %v, want the kernel's refusal (EINVAL) naming %s", err, p.podNS)
		}
		if legacyRefused.Load() {
			t.Error("a refusal of the storage map counted as the kernel's lacking the legacy request")
		}
		got := dump(t, p.podNS)
		if !legacyRefused.Load() {
			t.Error("the legacy request refused and the requests by family accepted, but not remembered")
		}
		if diff := gocmp.Diff(byCookie(want), byCookie(got), equateAddrs); diff != "" {
			t.Errorf("sockets after falling back (-want +got):\n%s", diff)
		}
		if diff := gocmp.Diff(endsOfConns(servers...), sortedEnds(ServerConns(got)), equateAddrs); diff != "" {
			t.Errorf("ServerConns after falling back (-want +got):\n%s", diff)
		}
		// Remembered: later dumps ask by family at once.
		if diff := gocmp.Diff(byCookie(want), byCookie(dump(t, p.podNS)), equateAddrs); diff != "" {
			t.Errorf("sockets of the next dump (-want +got):\n%s", diff)
		}
	})
}

// TestKernelDumpServerSide: DumpServerSide gives what Dump gives in
// LISTEN, ESTABLISHED and CLOSE_WAIT and nothing else, so the same
// ServerConns; by family too.
func TestKernelDumpServerSide(t *testing.T) {
	testenv.RequireRoot(t)
	p, m, _ := mixedNamespace(t, 22)
	check := func(t *testing.T) {
		all := dump(t, p.podNS, m.FD())
		narrow, err := DumpServerSide(p.podNS, []int{m.FD()})
		if err != nil {
			t.Fatal(err)
		}
		var want []Socket
		for _, s := range all {
			if serverSideStates&(1<<s.State) != 0 {
				want = append(want, s)
			}
		}
		if len(want) == len(all) {
			t.Fatalf("Dump gave no socket in another state: %v", all)
		}
		if diff := gocmp.Diff(byCookie(want), byCookie(narrow), equateAddrs); diff != "" {
			t.Errorf("DumpServerSide (-Dump's in its states +got):\n%s", diff)
		}
		if diff := gocmp.Diff(byCookie(ServerConns(all)), byCookie(ServerConns(narrow)), equateAddrs); diff != "" || len(ServerConns(all)) == 0 {
			t.Errorf("ServerConns of Dump (-) and of DumpServerSide (+):\n%s", diff)
		}
	}
	t.Run("legacy", check)
	t.Run("by family", func(t *testing.T) { withoutLegacy(t, func() { check(t) }) })
}
