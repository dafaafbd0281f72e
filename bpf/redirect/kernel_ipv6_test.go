//go:build linux

package redirect

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sockscale/sockscale/internal/testutil/localroute"
)

// The IPv6 tests' addresses: IPv6 has one loopback address, so they are
// /128s of fd5c:a1e:300::/64 (ULA) on a link of the test's own (one end of
// a veth pair whose both ends stay in this namespace: kernels without the
// dummy driver have veth), which makes them local addresses: traffic to
// them never leaves the machine (addr checks the route; the machine's
// default IPv6 route leads off it and must never be taken).

// v6Link is a link holding IPv6 test addresses until its test ends.
type v6Link struct {
	link netlink.Link
}

func newV6Link(t testing.TB) *v6Link {
	t.Helper()
	pid := strconv.Itoa(os.Getpid()) // names: at most 11 bytes of the 15 allowed
	name := "ssrd" + pid
	if stale, err := netlink.LinkByName(name); err == nil {
		_ = netlink.LinkDel(stale) // a crashed run's, with the same pid
	}
	l := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "ssrp" + pid}
	if err := netlink.LinkAdd(l); err != nil {
		t.Fatalf("add veth %s: %v", name, err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(l) })
	// Both ends up: the link has a carrier, which IPv6 waits for before
	// it installs an address's local route.
	for _, n := range []string{name, l.PeerName} {
		if err := netlink.LinkSetUp(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: n}}); err != nil {
			t.Fatalf("set %s up: %v", n, err)
		}
	}
	return &v6Link{link: l}
}

// addr puts fd5c:a1e:300::<host> on the link and returns it once the
// kernel routes it as a local address. No duplicate address detection:
// the address is usable at once, and the link is ours alone.
func (l *v6Link) addr(t testing.TB, host uint16) netip.Addr {
	t.Helper()
	a := netip.AddrFrom16([16]byte{0xfd, 0x5c, 0x0a, 0x1e, 0x03, 0x00, 14: byte(host >> 8), 15: byte(host)})
	na := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(128, 128)}, Flags: unix.IFA_F_NODAD}
	if err := netlink.AddrAdd(l.link, na); err != nil {
		t.Fatalf("add %s to %s: %v", a, l.link.Attrs().Name, err)
	}
	// The local route comes with the address once the link has its
	// carrier, which may take a moment after the link came up.
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		err := localroute.Check(a, localroute.Local())
		if err == nil {
			return a
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
}

// newServices6 is newServices on IPv6 addresses: the Service address
// fd5c:a1e:300::1, backends at ::101, ::102, ...
func newServices6(t testing.TB, n int) *services {
	t.Helper()
	l := newV6Link(t)
	s := &services{direct: serve(t, "direct", l.addr(t, 1), 0), v6: l}
	s.svc = s.direct.addr
	for i := range n {
		s.backends = append(s.backends, serve(t, "backend-"+strconv.Itoa(i), l.addr(t, uint16(0x101+i)), 0))
	}
	return s
}

// TestKernelRedirectIPv6: a connect to an IPv6 Service address (connect6,
// not IPv4-mapped) goes to an IPv6 backend, and getpeername gives back the
// dialled IPv6 address.
func TestKernelRedirectIPv6(t *testing.T) {
	e := newKernelEnv(t, "")
	s := newServices6(t, 1)
	if got := mustDial(t, s.svc); got.backend != "direct" || got.peer != s.svc {
		t.Fatalf("without an entry: answered by %s, peer %s; want direct, %s", got.backend, got.peer, s.svc)
	}
	if err := e.r.Set(s.svc, s.weighted(1)); err != nil {
		t.Fatal(err)
	}
	const n = 20
	for range n {
		if got := mustDial(t, s.svc); got.backend != "backend-0" || got.peer != s.svc {
			t.Fatalf("with an entry: answered by %s, peer %s; want backend-0, the dialled %s", got.backend, got.peer, s.svc)
		}
	}
	entries, err := e.r.Entries()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[netip.AddrPort][]Backend{s.svc: s.weighted(1)}, entries, addrPortComparer); diff != "" {
		t.Errorf("Entries (-want +got):\n%s", diff)
	}
	if got := redirectedCount(t, e.r, s.svc); got != n {
		t.Errorf("redirected %d connects, want %d", got, n)
	}
	if err := e.r.Delete(s.svc); err != nil {
		t.Fatal(err)
	}
	if got := mustDial(t, s.svc); got.backend != "direct" || got.peer != s.svc {
		t.Errorf("after Delete: answered by %s, peer %s; want direct, %s", got.backend, got.peer, s.svc)
	}
	if ev, err := e.r.Events(); err != nil || ev != (Events{}) {
		t.Errorf("Events() = %+v, %v; want none", ev, err)
	}
}

// TestKernelDualStackService: a dual-stack Service has an entry per
// address, each with backends of its family. An IPv4 connect, a dual-stack
// socket's ::ffff:<IPv4> and an IPv6 connect each go to a backend of their
// own family and read back what they dialled.
func TestKernelDualStackService(t *testing.T) {
	e := newKernelEnv(t, "")
	s4, s6 := newServices(t, 1), newServices6(t, 1)
	for _, s := range []*services{s4, s6} {
		if err := e.r.Set(s.svc, s.weighted(1)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name     string
		family   int
		sa       unix.Sockaddr
		wantPeer netip.AddrPort
	}{
		{"IPv4", unix.AF_INET, &unix.SockaddrInet4{Addr: s4.svc.Addr().As4(), Port: int(s4.svc.Port())}, s4.svc},
		{"IPv4-mapped", unix.AF_INET6, mapped(s4.svc), netip.AddrPortFrom(netip.AddrFrom16(s4.svc.Addr().As16()), s4.svc.Port())},
		{"IPv6", unix.AF_INET6, &unix.SockaddrInet6{Addr: s6.svc.Addr().As16(), Port: int(s6.svc.Port())}, s6.svc},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fd, err := rawConnect(t, tc.family, tc.sa)
			if err != nil {
				t.Fatalf("connect to %s: %v", tc.wantPeer, err)
			}
			if got := readName(t, fd); got != "backend-0" {
				t.Errorf("answered by %s, want backend-0", got)
			}
			if got := sockPeer(t, fd); got != tc.wantPeer {
				t.Errorf("getpeername = %s, want the dialled %s", got, tc.wantPeer)
			}
		})
	}
	counts, err := e.r.Redirected()
	if err != nil {
		t.Fatal(err)
	}
	// connect4's and the mapped connect6's are the same key.
	if diff := cmp.Diff(map[netip.AddrPort]uint64{s4.svc: 2, s6.svc: 1}, counts, addrPortComparer); diff != "" {
		t.Errorf("Redirected (-want +got):\n%s", diff)
	}
}

// sockPeer is getpeername(2) of fd, keeping an IPv4-mapped address
// mapped.
func sockPeer(t *testing.T, fd int) netip.AddrPort {
	t.Helper()
	sa, err := unix.Getpeername(fd)
	if err != nil {
		t.Fatal(err)
	}
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
	}
	t.Fatalf("getpeername: %T, want an IP address", sa)
	return netip.AddrPort{}
}

// TestKernelMixedFamilyRefused: Set refuses an entry whose backends are of
// the other family than its Service address; and an entry written past the
// loader (the program trusts no writer) is refused by the program, the
// connect left as it was and counted as entry_refused. A second hop of the
// other family keeps the first hop's backend.
func TestKernelMixedFamilyRefused(t *testing.T) {
	e := newKernelEnv(t, "")
	s4, s6 := newServices(t, 1), newServices6(t, 1)
	for _, tc := range []struct {
		svc     netip.AddrPort
		backend netip.AddrPort
		wantErr string
	}{
		{s6.svc, s4.backends[0].addr, fmt.Sprintf("set: service %s: backend 0 (%s) is IPv4, the service IPv6: an entry's backends must be of its family", s6.svc, s4.backends[0].addr)},
		{s4.svc, s6.backends[0].addr, fmt.Sprintf("set: service %s: backend 0 (%s) is IPv6, the service IPv4: an entry's backends must be of its family", s4.svc, s6.backends[0].addr)},
	} {
		err := e.r.Set(tc.svc, []Backend{{Addr: tc.backend, Weight: 1}})
		if err == nil || err.Error() != tc.wantErr || !errors.Is(err, ErrInvalid) {
			t.Errorf("Set(%s, [%s]) = %v, want an ErrInvalid %q", tc.svc, tc.backend, err, tc.wantErr)
		}
	}
	if entries, err := e.r.Entries(); err != nil || len(entries) != 0 {
		t.Fatalf("Entries() = %v, %v; want none after refused Sets", entries, err)
	}

	// Past the loader: mixed entries straight into the map.
	put := func(svc netip.AddrPort, backend netip.AddrPort) {
		t.Helper()
		key := addrKey(svc)
		b := addrKey(backend)
		entry := redirectSvcEntry{Count: 1, Total: 1, Svc: key}
		entry.Backends[0] = redirectBackend{Ip: b.Ip, Port: b.Port, Weight: 1}
		if err := e.r.objs.Services.Update(&key, &entry, ebpf.UpdateLock); err != nil {
			t.Fatal(err)
		}
	}
	put(s4.svc, s6.backends[0].addr)
	put(s6.svc, s4.backends[0].addr)
	if got := mustDial(t, s4.svc); got.backend != "direct" || got.peer != s4.svc {
		t.Errorf("IPv4 Service with an IPv6 backend: answered by %s, peer %s; want direct, %s", got.backend, got.peer, s4.svc)
	}
	fd, err := rawConnect(t, unix.AF_INET6, mapped(s4.svc))
	if err != nil {
		t.Fatalf("connect to ::ffff:%s: %v", s4.svc, err)
	}
	if got := readName(t, fd); got != "direct" {
		t.Errorf("::ffff:<IPv4 Service> with an IPv6 backend: answered by %s, want direct", got)
	}
	if got := mustDial(t, s6.svc); got.backend != "direct" || got.peer != s6.svc {
		t.Errorf("IPv6 Service with an IPv4 backend: answered by %s, peer %s; want direct, %s", got.backend, got.peer, s6.svc)
	}

	// A split to a revision whose own entry (Proxy mode) is of the other
	// family: the connect stops at the revision's address.
	revision := serve(t, "revision", s6.v6.addr(t, 2), 0)
	if err := e.r.Set(s6.svc, []Backend{{Addr: revision.addr, Weight: 1}}); err != nil {
		t.Fatal(err)
	}
	put(revision.addr, s4.backends[0].addr)
	if got := mustDial(t, s6.svc); got.backend != "revision" || got.peer != s6.svc {
		t.Errorf("a second hop of the other family: answered by %s, peer %s; want revision, %s", got.backend, got.peer, s6.svc)
	}
	if ev, err := e.r.Events(); err != nil || ev != (Events{EntryRefused: 4}) {
		t.Errorf("Events() = %+v, %v; want 4 entry_refused", ev, err)
	}
	counts, err := e.r.Redirected()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[netip.AddrPort]uint64{s6.svc: 1}, counts, addrPortComparer); diff != "" {
		t.Errorf("Redirected (-want +got):\n%s", diff)
	}
}

// TestKernelSplitToProxiedRevisionIPv6: the two hops of an IPv6 split, to
// a revision in Proxy mode.
func TestKernelSplitToProxiedRevisionIPv6(t *testing.T) {
	e := newKernelEnv(t, "")
	route := newServices6(t, 1)
	revision := serve(t, "revision", route.v6.addr(t, 2), 0)
	if err := e.r.Set(route.svc, []Backend{{Addr: revision.addr, Weight: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := e.r.Set(revision.addr, route.weighted(1)); err != nil {
		t.Fatal(err)
	}
	if got := mustDial(t, route.svc); got.backend != "backend-0" || got.peer != route.svc {
		t.Errorf("split to a revision in Proxy mode: answered by %s, peer %s; want backend-0, %s", got.backend, got.peer, route.svc)
	}
}

// TestKernelLeaseIPv6: a lapsed lease leaves IPv6 connects alone too.
func TestKernelLeaseIPv6(t *testing.T) {
	e := newKernelEnv(t, "")
	s := newServices6(t, 1)
	if err := e.r.Set(s.svc, s.weighted(1)); err != nil {
		t.Fatal(err)
	}
	if err := e.r.Renew(time.Nanosecond); err != nil {
		t.Fatal(err)
	}
	if got := mustDial(t, s.svc); got.backend != "direct" || got.peer != s.svc {
		t.Errorf("after the lease lapsed: answered by %s, peer %s; want direct, %s", got.backend, got.peer, s.svc)
	}
	if ev, err := e.r.Events(); err != nil || ev != (Events{LeaseExpired: 1}) {
		t.Errorf("Events() = %+v, %v; want 1 lease_expired", ev, err)
	}
	if err := e.r.Renew(time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := mustDial(t, s.svc); got.backend != "backend-0" {
		t.Errorf("after a renewal: answered by %s, want backend-0", got.backend)
	}
}

// v4Object is the redirect object of the last IPv4-only build (4-byte
// addresses in svc_key and backend), as it was committed: an agent
// upgraded from it finds its maps pinned and its programs attached.
//
//go:embed testdata/redirect-v4_bpfel.o
var v4Object []byte

// installV4 does what that build's New did: its maps pinned in its
// layout's directory, its programs attached at root through links pinned
// under this build's names, a lease for good. It returns the maps.
func installV4(t *testing.T, root, pins string) map[string]*ebpf.Map {
	t.Helper()
	spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(v4Object))
	if err != nil {
		t.Fatal(err)
	}
	if got := spec.Maps["services"].KeySize; got != 8 {
		t.Fatalf("testdata object: services key of %d bytes, want the IPv4-only layout's 8", got)
	}
	layout, err := mapsLayout(spec)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(pins, layout)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, m := range spec.Maps {
		m.Pinning = ebpf.PinByName
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(coll.Close)
	if err := coll.Maps["lease"].Update(uint32(0), uint64(math.MaxUint64), ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	for _, at := range attachments {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: root, Attach: at.attach, Program: coll.Programs["sockscale_"+at.name]})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Pin(filepath.Join(pins, linkPrefix+at.name)); err != nil {
			t.Fatal(err)
		}
		_ = l.Close()
	}
	return coll.Maps
}

// v4KeyOf is the IPv4-only layout's key of an IPv4 address.
func v4KeyOf(a netip.AddrPort) v4SvcKey {
	k := addrKey(a) // the mapped form's last word is the IPv4 word
	return v4SvcKey{IP: k.Ip.W[3], Port: k.Port}
}

// TestKernelUpgradeFromIPv4Layout: an agent of this build starting over
// the pinned maps and links of the IPv4-only build converts the entries
// and counters into its maps before it swaps the programs: a client
// connecting back to back throughout is redirected every time, and the
// old maps are gone after.
func TestKernelUpgradeFromIPv4Layout(t *testing.T) {
	pins := pinDir(t)
	e := newCgroupEnv(t)
	s := newServices(t, 3)
	old := installV4(t, e.root, pins)
	key := v4KeyOf(s.svc)
	entry := v4SvcEntry{Count: 3, Total: 3, Svc: key}
	for i, b := range s.backends {
		bk := v4KeyOf(b.addr)
		entry.Backends[i] = v4Backend{IP: bk.IP, Port: bk.Port, Weight: 1}
	}
	if err := old["services"].Update(&key, &entry, ebpf.UpdateLock); err != nil {
		t.Fatal(err)
	}
	e.enter(t)
	if got := mustDial(t, s.svc); got.backend == "direct" || got.peer != s.svc {
		t.Fatalf("under the IPv4-only build: answered by %s, peer %s; want a backend, %s", got.backend, got.peer, s.svc)
	}

	loop := startConnectLoop(s.svc)
	defer loop.Stop()
	wait := func(n int) {
		for mark := loop.len(); loop.len() < mark+n; {
			time.Sleep(time.Millisecond)
		}
	}
	wait(200)
	before := len(loop.since(0))
	migrateStart := time.Now()
	e.r = e.attach(t, pins)
	migrateEnd := time.Now()
	wait(200)
	results := loop.Stop()

	counts := map[string]int{}
	overlapped, backendPeer := 0, 0
	for _, r := range results {
		if r.err != nil {
			t.Fatalf("connect failed during the upgrade: %v", r.err)
		}
		counts[r.backend]++
		overlap := r.end.After(migrateStart) && r.start.Before(migrateEnd)
		if overlap {
			overlapped++
		}
		// A connect of the old program and a getpeername of the new one
		// (New swaps getpeername first) shows the backend: the dialled
		// address is in the old maps' socket storage (see New). Only
		// while New runs.
		if r.peer != s.svc {
			if !overlap {
				t.Errorf("getpeername %s of a connect at %v..%v, outside New (%v..%v); want the dialled %s",
					r.peer, r.start.Format(time.StampMicro), r.end.Format(time.StampMicro), migrateStart.Format(time.StampMicro), migrateEnd.Format(time.StampMicro), s.svc)
			}
			backendPeer++
		}
	}
	t.Logf("%d connects across the upgrade (%d before it, %d overlapping New, %d of them reading back the backend): %v",
		len(results), before, overlapped, backendPeer, counts)
	if counts["direct"] != 0 {
		t.Errorf("%d connects went to the Service address during the upgrade, want 0", counts["direct"])
	}
	entries, err := e.r.Entries()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[netip.AddrPort][]Backend{s.svc: s.weighted(1, 1, 1)}, entries, addrPortComparer); diff != "" {
		t.Errorf("Entries after the upgrade (-want +got):\n%s", diff)
	}
	// Every connect counted: the one before the loop, in the old maps
	// until the copy, in the new after the swap; only those overlapping
	// New may be missing.
	want := uint64(len(results) + 1)
	if got := redirectedCount(t, e.r, s.svc); got > want || got+uint64(overlapped) < want {
		t.Errorf("redirected = %d, want the %d connects, less at most the %d that overlapped the copy", got, want, overlapped)
	}
	if n := attachedPrograms(t, e.root); n != len(attachments) {
		t.Errorf("after the upgrade %d programs are attached, want %d", n, len(attachments))
	}
	layouts, err := otherLayouts(pins, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(layouts) != 1 {
		t.Errorf("map directories after the upgrade: %v, want this build's only", layouts)
	}
}
