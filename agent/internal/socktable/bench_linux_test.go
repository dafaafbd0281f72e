package socktable

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// BenchmarkDump: one Dump of a namespace without sockets (the fixed cost:
// the kernel walks every bucket of the established-connections hash table,
// shared by all namespaces unless they were made with one of their own,
// once with the legacy request and once per family without it), of one
// with a hash table of its own, and of one with 10,000 open server
// connections (clients in another namespace, a process of their own),
// without and with an sk_storage map that holds a value for every one;
// "by-family" as on a kernel without the legacy request, "server-side"
// DumpServerSide; then ServerConns of the 10,000; then Dump and
// DumpServerSide once the server has closed them all (FIN_WAIT2 until the
// clients close: sockets only Dump reports).
func BenchmarkDump(b *testing.B) {
	testenv.RequireRoot(b)
	const conns = 10000
	_, empty := newNetns(b, "", "")
	b.Run("sockets=0", func(b *testing.B) { benchDump(b, Dump, empty, nil) })
	b.Run("sockets=0,by-family", func(b *testing.B) { withoutLegacy(b, func() { benchDump(b, Dump, empty, nil) }) })
	b.Run("sockets=0,own-ehash", func(b *testing.B) { benchDump(b, Dump, newNetnsOwnEhash(b, 1024), nil) })

	p := newPair(b, "", 10)
	ln, accepted := listen(b, p.pod, "tcp4", netip.AddrPortFrom(p.podAddr, 8080).String())
	dialFromChild(b, p.peer, ln.Addr().String(), conns)
	servers := take(b, accepted, conns)
	b.Run(fmt.Sprintf("conns=%d", conns), func(b *testing.B) { benchDump(b, Dump, p.podNS, nil) })
	b.Run(fmt.Sprintf("conns=%d,by-family", conns), func(b *testing.B) { withoutLegacy(b, func() { benchDump(b, Dump, p.podNS, nil) }) })

	m, err := ebpf.NewMap(skStorageSpec("sockscale_bench"))
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	for _, c := range servers {
		var uerr error
		if err := connFD(c.(*net.TCPConn), func(fd int) { uerr = m.Update(uint32(fd), uint64(fd), ebpf.UpdateAny) }); err != nil || uerr != nil {
			b.Fatal(err, uerr)
		}
	}
	b.Run(fmt.Sprintf("conns=%d,storage", conns), func(b *testing.B) { benchDump(b, Dump, p.podNS, []int{m.FD()}) })
	b.Run(fmt.Sprintf("conns=%d,storage,server-side", conns), func(b *testing.B) { benchDump(b, DumpServerSide, p.podNS, []int{m.FD()}) })

	socks, err := Dump(p.podNS, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run(fmt.Sprintf("ServerConns/sockets=%d", len(socks)), func(b *testing.B) {
		var n int
		for b.Loop() {
			n = len(ServerConns(socks))
		}
		if n != conns {
			b.Fatalf("%d server connections, want %d", n, conns)
		}
	})

	// The server closes them all: each waits in FIN_WAIT2 for the client's
	// FIN (at most net.ipv4.tcp_fin_timeout), which Dump reports and
	// DumpServerSide leaves out.
	for _, c := range servers {
		c.Close()
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		socks, err := Dump(p.podNS, nil)
		if err != nil {
			b.Fatal(err)
		}
		if finWait2 := countState(socks, FinWait2); finWait2 == conns {
			break
		} else if time.Now().After(deadline) {
			b.Fatalf("%d of %d connections in FIN_WAIT2 after 10s", finWait2, conns)
		}
	}
	b.Run(fmt.Sprintf("server-closed=%d", conns), func(b *testing.B) { benchDump(b, Dump, p.podNS, nil) })
	b.Run(fmt.Sprintf("server-closed=%d,server-side", conns), func(b *testing.B) { benchDump(b, DumpServerSide, p.podNS, nil) })
}

func countState(socks []Socket, st State) int {
	n := 0
	for _, s := range socks {
		if s.State == st {
			n++
		}
	}
	return n
}

func benchDump(b *testing.B, dump func(Namespace, []int) ([]Socket, error), ns Namespace, mapFDs []int) {
	var socks []Socket
	for b.Loop() {
		var err error
		if socks, err = dump(ns, mapFDs); err != nil {
			b.Fatal(err)
		}
	}
	withStorage := 0
	for _, s := range socks {
		if s.Storage != nil {
			withStorage++
		}
	}
	b.ReportMetric(float64(len(socks)), "sockets/op")
	if len(mapFDs) > 0 {
		b.ReportMetric(float64(withStorage), "stored/op")
	}
}

// BenchmarkFindNamespaces: Find among 250 named namespaces (each with an
// address on lo) and this machine's processes, looking for every
// namespace's address.
func BenchmarkFindNamespaces(b *testing.B) {
	testenv.RequireRoot(b)
	const n = 250
	dir := b.TempDir()
	want := make([]netip.Addr, 0, n)
	for i := range n {
		h, _ := newNetns(b, dir, fmt.Sprintf("ns%d", i))
		a := netip.AddrFrom4([4]byte{10, 201, byte(i >> 8), byte(i)})
		if err := addAddr(h, "lo", a, netip.Addr{}); err != nil {
			b.Fatal(err)
		}
		want = append(want, a)
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	pids := 0
	for _, e := range procs {
		if isPID(e.Name()) {
			pids++
		}
	}
	f := Finder{NetnsDir: dir}
	var found map[netip.Addr]Namespace
	for b.Loop() {
		if found, err = f.Find(want); err != nil {
			b.Fatal(err)
		}
	}
	if len(found) != n {
		b.Fatalf("found %d namespaces of %d", len(found), n)
	}
	b.ReportMetric(float64(n), "namespaces/op")
	b.ReportMetric(float64(pids), "processes/op")
}

// newNetnsOwnEhash makes an empty namespace with an established-connections
// hash table of its own of the given size, as every new namespace gets when
// net.ipv4.tcp_child_ehash_entries is set in the namespace that creates it
// (here a namespace of the test's, so the host's setting is left alone).
func newNetnsOwnEhash(b *testing.B, entries int) Namespace {
	b.Helper()
	parent, _ := newNetns(b, "", "")
	var h netns.NsHandle
	err := inNetns(parent, func() error {
		// /proc/sys/net is the opening thread's namespace's.
		if err := os.WriteFile("/proc/sys/net/ipv4/tcp_child_ehash_entries", []byte(strconv.Itoa(entries)), 0); err != nil {
			return err
		}
		var err error
		h, err = netns.New()
		return err
	})
	if err != nil {
		b.Fatalf("namespace with its own hash table: %v", err)
	}
	b.Cleanup(func() { h.Close() })
	var st unix.Stat_t
	if err := unix.Fstat(int(h), &st); err != nil {
		b.Fatal(err)
	}
	return Namespace{Path: fmt.Sprintf("/proc/self/fd/%d", int(h)), Dev: st.Dev, Inode: st.Ino}
}
