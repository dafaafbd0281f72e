package socktable

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// ends is a connection's local and remote address, unmapped as Socket has
// them.
type ends struct{ Local, Remote netip.AddrPort }

func endsOf(c net.Conn) ends {
	unmap := func(a net.Addr) netip.AddrPort {
		ap := a.(*net.TCPAddr).AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return ends{unmap(c.LocalAddr()), unmap(c.RemoteAddr())}
}

func endsOfSocket(s Socket) ends { return ends{s.Local, s.Remote} }

// byEnds indexes sockets by their two ends.
func byEnds(t *testing.T, socks []Socket) map[ends]Socket {
	t.Helper()
	m := make(map[ends]Socket, len(socks))
	for _, s := range socks {
		if s.State == Listen {
			continue
		}
		if _, dup := m[endsOfSocket(s)]; dup {
			t.Fatalf("two sockets %v", endsOfSocket(s))
		}
		m[endsOfSocket(s)] = s
	}
	return m
}

func sortedEnds(socks []Socket) []ends {
	out := make([]ends, 0, len(socks))
	for _, s := range socks {
		out = append(out, endsOfSocket(s))
	}
	return sortEnds(out)
}

func endsOfConns(conns ...net.Conn) []ends {
	out := make([]ends, 0, len(conns))
	for _, c := range conns {
		out = append(out, endsOf(c))
	}
	return sortEnds(out)
}

func sortEnds(e []ends) []ends {
	slices.SortFunc(e, func(a, b ends) int {
		if c := a.Local.Compare(b.Local); c != 0 {
			return c
		}
		return a.Remote.Compare(b.Remote)
	})
	return e
}

func dump(t *testing.T, ns Namespace, mapFDs ...int) []Socket {
	t.Helper()
	socks, err := Dump(ns, mapFDs)
	if err != nil {
		t.Fatal(err)
	}
	return socks
}

// TestKernelServerConns: in a pod's namespace a server has 5 idle
// connections and the pod has one of its own to a server outside;
// FindNamespaces finds the pod's namespace by its address, and Dump and
// ServerConns give exactly the 5, until the server closes some.
func TestKernelServerConns(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	p := newPair(t, dir, 1)
	ln, accepted := listen(t, p.pod, "tcp4", netip.AddrPortFrom(p.podAddr, 8080).String())
	clients := dial(t, p.peer, ln.Addr().String(), 5)
	servers := take(t, accepted, 5)
	outLn, outAccepted := listen(t, p.peer, "tcp4", netip.AddrPortFrom(p.peerAddr, 9090).String())
	out := dial(t, p.pod, outLn.Addr().String(), 1)[0]
	take(t, outAccepted, 1)

	fds := openFDs(t)
	found, err := Finder{NetnsDir: dir}.Find([]netip.Addr{p.podAddr, p.peerAddr})
	if err != nil {
		t.Fatal(err)
	}
	want := map[netip.Addr]Namespace{p.podAddr: p.podNS, p.peerAddr: p.peerNS}
	if diff := cmp.Diff(want, found, equateAddrs); diff != "" {
		t.Fatalf("Find (-want +got):\n%s", diff)
	}
	socks := dump(t, found[p.podAddr])
	if got := openFDs(t); got != fds {
		t.Errorf("Find and Dump left %d file descriptors open", got-fds)
	}

	conns := ServerConns(socks)
	if diff := cmp.Diff(endsOfConns(servers...), sortedEnds(conns), equateAddrs); diff != "" {
		t.Fatalf("ServerConns (-want +got):\n%s\nall sockets: %v", diff, socks)
	}
	cookies, inodes := map[uint64]bool{}, map[uint32]bool{}
	for _, s := range conns {
		if s.State != Established || s.Family != FamilyIPv4 || s.Cookie == 0 || s.Inode == 0 || s.UID != 0 || s.Storage != nil {
			t.Errorf("server connection %+v: want ESTABLISHED, IPv4, a cookie, an inode, uid 0, no storage", s)
		}
		cookies[s.Cookie], inodes[s.Inode] = true, true
	}
	if len(cookies) != 5 || len(inodes) != 5 {
		t.Errorf("%d distinct cookies and %d distinct inodes among 5 connections", len(cookies), len(inodes))
	}
	all := byEnds(t, socks)
	if s, ok := all[endsOf(out)]; !ok || s.State != Established {
		t.Errorf("the pod's outbound connection %v: %+v, want it dumped, ESTABLISHED (and not a server connection)", endsOf(out), s)
	}
	if !slices.ContainsFunc(socks, func(s Socket) bool { return s.State == Listen && s.Local.Port() == 8080 }) {
		t.Errorf("no listener on 8080 among %v", socks)
	}

	// The client closes its side: the server's socket is in CLOSE_WAIT and
	// still open.
	clients[0].Close()
	waitFor(t, "the server's socket in CLOSE_WAIT", func() bool {
		return byEnds(t, dump(t, p.podNS))[endsOf(servers[0])].State == CloseWait
	})
	if diff := cmp.Diff(endsOfConns(servers...), sortedEnds(ServerConns(dump(t, p.podNS))), equateAddrs); diff != "" {
		t.Errorf("ServerConns after a client closed (-want +got):\n%s", diff)
	}

	// The server closes two: they are no longer open, though the kernel
	// still finishes them.
	servers[1].Close()
	servers[2].Close()
	socks = dump(t, p.podNS)
	if diff := cmp.Diff(endsOfConns(servers[0], servers[3], servers[4]), sortedEnds(ServerConns(socks)), equateAddrs); diff != "" {
		t.Errorf("ServerConns after the server closed two (-want +got):\n%s", diff)
	}
	for _, c := range servers[1:3] {
		s := byEnds(t, socks)[endsOf(c)]
		t.Logf("closed by the server: %v %v inode %d", endsOf(c), s.State, s.Inode)
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 5s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// skStorageSpec is a BPF_MAP_TYPE_SK_STORAGE map of 8-byte values, with
// the BTF the kernel requires of one (an int key, a struct value).
func skStorageSpec(name string) *ebpf.MapSpec {
	u64 := &btf.Int{Name: "unsigned long long", Size: 8}
	return &ebpf.MapSpec{
		Name:      name,
		Type:      ebpf.SkStorage,
		KeySize:   4,
		ValueSize: 8,
		Flags:     unix.BPF_F_NO_PREALLOC,
		Key:       &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed},
		Value:     &btf.Struct{Name: name + "_value", Size: 8, Members: []btf.Member{{Name: "n", Type: u64}}},
	}
}

// newSkStorage makes an sk_storage map and says its ID.
func newSkStorage(t *testing.T, name string) (*ebpf.Map, uint32) {
	t.Helper()
	m, err := ebpf.NewMap(skStorageSpec(name))
	if err != nil {
		t.Fatalf("create an sk_storage map: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := info.ID()
	if !ok {
		t.Fatal("the kernel gives no map IDs")
	}
	return m, uint32(id)
}

// TestKernelDumpStorage: each socket comes with its values in the
// sk_storage maps Dump is given, and only with those.
func TestKernelDumpStorage(t *testing.T) {
	testenv.RequireRoot(t)
	p := newPair(t, "", 2)
	ln, accepted := listen(t, p.pod, "tcp4", netip.AddrPortFrom(p.podAddr, 8080).String())
	dial(t, p.peer, ln.Addr().String(), 3)
	servers := take(t, accepted, 3)
	m1, id1 := newSkStorage(t, "sockscale_t1")
	m2, id2 := newSkStorage(t, "sockscale_t2")
	v1, v2 := []byte{1, 2, 3, 4, 5, 6, 7, 8}, []byte{0xff, 0, 0, 0, 0, 0, 0, 0x7f}
	update := func(m *ebpf.Map, c net.Conn, v []byte) {
		t.Helper()
		var uerr error
		if err := connFD(c.(syscall.Conn), func(fd int) { uerr = m.Update(uint32(fd), v, ebpf.UpdateAny) }); err != nil || uerr != nil {
			t.Fatalf("update the socket's storage: %v %v", err, uerr)
		}
	}
	update(m1, servers[1], v1)
	update(m2, servers[2], v2)

	want := map[ends]map[uint32][]byte{
		endsOf(servers[0]): nil,
		endsOf(servers[1]): {id1: v1},
		endsOf(servers[2]): {id2: v2},
	}
	got := map[ends]map[uint32][]byte{}
	socks := dump(t, p.podNS, m1.FD(), m2.FD())
	for _, s := range socks {
		if s.State == Listen {
			if s.Storage != nil {
				t.Errorf("the listener has storage %v", s.Storage)
			}
			continue
		}
		got[endsOfSocket(s)] = s.Storage
	}
	if diff := cmp.Diff(want, got, equateAddrs); diff != "" {
		t.Errorf("storage by connection (-want +got):\n%s", diff)
	}
	for _, s := range dump(t, p.podNS) {
		if s.Storage != nil {
			t.Errorf("storage %v dumped without asking", s.Storage)
		}
	}
}

// TestKernelDumpCookie: Cookie is the kernel's socket cookie, as
// getsockopt SO_COOKIE (and bpf_get_socket_cookie) have it.
func TestKernelDumpCookie(t *testing.T) {
	testenv.RequireRoot(t)
	p := newPair(t, "", 3)
	ln, accepted := listen(t, p.pod, "tcp4", netip.AddrPortFrom(p.podAddr, 8080).String())
	dial(t, p.peer, ln.Addr().String(), 3)
	servers := take(t, accepted, 3)
	socks := byEnds(t, dump(t, p.podNS))
	for _, c := range servers {
		var cookie uint64
		var gerr error
		if err := connFD(c.(syscall.Conn), func(fd int) { cookie, gerr = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE) }); err != nil || gerr != nil {
			t.Fatalf("SO_COOKIE: %v %v", err, gerr)
		}
		if s := socks[endsOf(c)]; s.Cookie != cookie {
			t.Errorf("%v: Cookie %d, SO_COOKIE %d", endsOf(c), s.Cookie, cookie)
		}
	}
}

// TestKernelIPv6ListenerTakesIPv4: a server on [::] accepts IPv4
// connections as IPv6 sockets with IPv4-mapped addresses; they are
// reported with IPv4 addresses and are server connections. The kernel
// says which IPv6 listeners are v6-only.
func TestKernelIPv6ListenerTakesIPv4(t *testing.T) {
	testenv.RequireRoot(t)
	p := newPair(t, "", 4)
	_, accepted := listen(t, p.pod, "tcp", "[::]:8080")                    // dual stack
	listen(t, p.pod, "tcp6", "[::]:8081")                                  // IPV6_V6ONLY
	listen(t, p.pod, "tcp4", netip.AddrPortFrom(p.podAddr, 8082).String()) // plain IPv4
	dial(t, p.peer, netip.AddrPortFrom(p.podAddr, 8080).String(), 3)
	servers := take(t, accepted, 3)

	socks := dump(t, p.podNS)
	conns := ServerConns(socks)
	if diff := cmp.Diff(endsOfConns(servers...), sortedEnds(conns), equateAddrs); diff != "" {
		t.Fatalf("ServerConns (-want +got):\n%s\nall sockets: %v", diff, socks)
	}
	for _, s := range conns {
		if s.Family != FamilyIPv6 || !s.Local.Addr().Is4() || !s.Remote.Addr().Is4() {
			t.Errorf("%+v: want an IPv6 socket with IPv4 addresses", s)
		}
	}
	type listener struct {
		Local  netip.AddrPort
		Family uint8
		V6Only bool
	}
	var got []listener
	for _, s := range socks {
		if s.State == Listen {
			got = append(got, listener{s.Local, s.Family, s.V6Only})
		}
	}
	slices.SortFunc(got, func(a, b listener) int { return int(a.Local.Port()) - int(b.Local.Port()) })
	want := []listener{
		{netip.MustParseAddrPort("[::]:8080"), FamilyIPv6, false},
		{netip.MustParseAddrPort("[::]:8081"), FamilyIPv6, true},
		{netip.AddrPortFrom(p.podAddr, 8082), FamilyIPv4, false},
	}
	if diff := cmp.Diff(want, got, equateAddrs); diff != "" {
		t.Errorf("listeners (-want +got):\n%s", diff)
	}
}

// TestKernelRequestsAreNotServerConns: a connection the kernel has not
// made a socket of yet (here held by TCP_DEFER_ACCEPT until the client
// sends) is dumped as SYN_RECV, without an inode, and is no server
// connection.
func TestKernelRequestsAreNotServerConns(t *testing.T) {
	testenv.RequireRoot(t)
	p := newPair(t, "", 5)
	ln, _ := listen(t, p.pod, "tcp4", netip.AddrPortFrom(p.podAddr, 8080).String())
	if err := connFD(ln.(*net.TCPListener), func(fd int) {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, 30); err != nil {
			t.Fatal(err)
		}
	}); err != nil {
		t.Fatal(err)
	}
	client := dial(t, p.peer, ln.Addr().String(), 1)[0]
	var req Socket
	waitFor(t, "the request dumped", func() bool {
		req = byEnds(t, dump(t, p.podNS))[ends{endsOf(client).Remote, endsOf(client).Local}]
		return req.State != 0
	})
	if req.State != SynRecv || req.Inode != 0 {
		t.Errorf("request %+v: want SYN_RECV without an inode", req)
	}
	if conns := ServerConns(dump(t, p.podNS)); len(conns) != 0 {
		t.Errorf("server connections %v, want none", conns)
	}
}

// TestKernelFindNamespaces: namespaces are found through processes too,
// each once; a namespace whose process has gone is refused when opened
// again; an address in two namespaces is refused, the others found.
func TestKernelFindNamespaces(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	addr := func(s string) netip.Addr { return netip.MustParseAddr(s) }

	// A namespace only a process is in, found through /proc.
	h, ns := newNetns(t, "", "")
	if err := addAddr(h, "lo", addr("10.200.9.2"), netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "60")
	if err := inNetns(h, cmd.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	// Two named namespaces that share an address.
	h1, ns1 := newNetns(t, dir, "a")
	h2, _ := newNetns(t, dir, "b")
	for _, a := range []struct {
		h netns.NsHandle
		a string
	}{{h1, "10.200.8.2"}, {h1, "10.200.8.3"}, {h2, "10.200.8.2"}} {
		if err := addAddr(a.h, "lo", addr(a.a), netip.Addr{}); err != nil {
			t.Fatal(err)
		}
	}
	// A name whose namespace is gone: not a mount any more.
	if err := os.WriteFile(filepath.Join(dir, "stale"), nil, 0o444); err != nil {
		t.Fatal(err)
	}

	fds := openFDs(t)
	found, err := Finder{NetnsDir: dir}.Find([]netip.Addr{addr("10.200.9.2"), addr("10.200.8.2"), addr("10.200.8.3"), addr("::ffff:10.200.8.3"), addr("10.200.9.99")})
	if err == nil || !strings.Contains(err.Error(), "address 10.200.8.2 is in more than one network namespace") ||
		!strings.Contains(err.Error(), filepath.Join(dir, "a")) || !strings.Contains(err.Error(), filepath.Join(dir, "b")) {
		t.Errorf("err = %v, want one naming 10.200.8.2 and both namespaces", err)
	}
	// Some machines keep a process or two out of even root's reach (this
	// one's PID 1 has capabilities we lack).
	t.Logf("Find: %v", err)
	if got := openFDs(t); got != fds {
		t.Errorf("Find left %d file descriptors open", got-fds)
	}
	byProc := Namespace{Path: fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid), Dev: ns.Dev, Inode: ns.Inode}
	want := map[netip.Addr]Namespace{addr("10.200.9.2"): byProc, addr("10.200.8.3"): ns1}
	if diff := cmp.Diff(want, found, equateAddrs); diff != "" {
		t.Errorf("Find (-want +got):\n%s", diff)
	}
	if socks, err := Dump(byProc, nil); err != nil || len(socks) != 0 {
		t.Errorf("Dump of the process's namespace: %v, %v; want no sockets", socks, err)
	}

	addrs, err := ns1.Addrs()
	slices.SortFunc(addrs, netip.Addr.Compare)
	if diff := cmp.Diff([]netip.Addr{addr("10.200.8.2"), addr("10.200.8.3"), addr("127.0.0.1"), addr("::1")}, addrs, equateAddrs); err != nil || diff != "" {
		t.Errorf("Addrs: %v (-want +got):\n%s", err, diff)
	}

	// The process exits: its path no longer leads to the namespace.
	cmd.Process.Kill()
	cmd.Wait()
	if _, err := byProc.Addrs(); !errors.Is(err, ErrNamespaceGone) {
		t.Errorf("Addrs after the process exited: err = %v, want ErrNamespaceGone", err)
	}
	if _, err := Dump(byProc, nil); !errors.Is(err, ErrNamespaceGone) || !strings.Contains(err.Error(), byProc.Path) {
		t.Errorf("Dump after the process exited: err = %v, want ErrNamespaceGone naming %s", err, byProc.Path)
	}
	// A path that leads to another namespace.
	other := Namespace{Path: "/proc/self/ns/net", Dev: ns.Dev, Inode: ns.Inode}
	if _, err := other.Open(); !errors.Is(err, ErrNamespaceGone) {
		t.Errorf("Open of a path to another namespace: err = %v, want ErrNamespaceGone", err)
	}
	if got, err := (Finder{NetnsDir: dir}).Find(nil); err != nil || len(got) != 0 {
		t.Errorf("Find(nil) = %v, %v; want nothing", got, err)
	}
}

// TestKernelDumpErrors: the kernel's refusal names the namespace.
func TestKernelDumpErrors(t *testing.T) {
	testenv.RequireRoot(t)
	_, ns := newNetns(t, "", "")
	arr, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer arr.Close()
	_, err = Dump(ns, []int{arr.FD()})
	if err == nil || !strings.Contains(err.Error(), ns.String()) || !strings.Contains(err.Error(), "refused") {
		t.Errorf("Dump with an array map: err = %v, want the kernel's refusal naming %s", err, ns)
	}
	t.Log(err)
}

// TestKernelDumpLeavesThreadsAlone: however many Dumps, every thread of
// the process stays in its network namespace.
func TestKernelDumpLeavesThreadsAlone(t *testing.T) {
	testenv.RequireRoot(t)
	_, ns := newNetns(t, "", "")
	errc := make(chan error, 8)
	for range cap(errc) {
		go func() {
			var err error
			for range 50 {
				if _, err = Dump(ns, nil); err != nil {
					break
				}
			}
			errc <- err
		}()
	}
	for range cap(errc) {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	var own unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &own); err != nil {
		t.Fatal(err)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join("/proc/self/task", task.Name(), "ns/net"), &st); err != nil {
			continue // a thread that ended
		}
		if st.Ino != own.Ino {
			t.Errorf("thread %s is in network namespace %d, not ours (%d)", task.Name(), st.Ino, own.Ino)
		}
	}
}

// TestKernelFindSkipsVanishedProcesses: a process gone between listing
// /proc and looking at its namespace is skipped, as is anything in /proc
// that is no process. The /proc here is a stand-in whose ns/net links say
// what each "process" has become.
func TestKernelFindSkipsVanishedProcesses(t *testing.T) {
	testenv.RequireRoot(t)
	h, ns := newNetns(t, t.TempDir(), "pod")
	a := netip.MustParseAddr("10.200.7.2")
	if err := addAddr(h, "lo", a, netip.Addr{}); err != nil {
		t.Fatal(err)
	}
	proc := t.TempDir()
	regular := filepath.Join(proc, "regular")
	if err := os.WriteFile(regular, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	for pid, target := range map[string]string{
		"100": "/nonexistent/ns/net", // exited before its ns/net was read
		"101": regular,               // not a namespace
		"102": ns.Path,               // the pod
		"103": ns.Path,               // another process of the pod
	} {
		if err := os.MkdirAll(filepath.Join(proc, pid, "ns"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(proc, pid, "ns/net")); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(proc, "104"), 0o755); err != nil { // exited: no ns/net at all
		t.Fatal(err)
	}
	found, err := Finder{ProcDir: proc, NetnsDir: t.TempDir()}.Find([]netip.Addr{a})
	if err != nil {
		t.Fatal(err)
	}
	got, ok := found[a]
	if !ok || got.Inode != ns.Inode || (got.Path != filepath.Join(proc, "102/ns/net") && got.Path != filepath.Join(proc, "103/ns/net")) {
		t.Errorf("Find = %v, want %v through process 102 or 103", found, ns)
	}
}
