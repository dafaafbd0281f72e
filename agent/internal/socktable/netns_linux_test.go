package socktable

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The tests' namespaces: a pod's and a peer's, joined by a veth pair, each
// end with a /32 address and a route to the other; all traffic stays in
// them.

// onOwnThread runs f on a locked thread of its own and then puts that
// thread back in its network namespace, so no other code ever runs in
// another namespace by mistake (a thread that cannot be put back ends
// with its goroutine, locked). The handle of the thread's namespace is
// closed before the answer, as tests count the process's descriptors.
func onOwnThread(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		ferr := f()
		err = netns.Set(orig)
		orig.Close()
		if err != nil {
			errc <- fmt.Errorf("return to our network namespace: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// inNetns runs f with its thread in the namespace h.
func inNetns(h netns.NsHandle, f func() error) error {
	return onOwnThread(func() error {
		if err := netns.Set(h); err != nil {
			return fmt.Errorf("enter %v: %w", h, err)
		}
		return f()
	})
}

// newNetns makes an empty network namespace, named dir/name by a bind
// mount (as ip-netns and container runtimes name theirs) when dir is not
// empty, and removes it when the test ends.
func newNetns(t testing.TB, dir, name string) (netns.NsHandle, Namespace) {
	t.Helper()
	var h netns.NsHandle
	err := onOwnThread(func() error {
		// netns.New moves the thread into the new namespace; onOwnThread
		// moves it back.
		var err error
		h, err = netns.New()
		return err
	})
	if err != nil {
		t.Fatalf("new network namespace: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	path := fmt.Sprintf("/proc/self/fd/%d", int(h))
	if dir != "" {
		path = filepath.Join(dir, name)
		if err := os.WriteFile(path, nil, 0o444); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", int(h)), path, "", unix.MS_BIND, ""); err != nil {
			t.Fatalf("bind-mount the namespace at %s: %v", path, err)
		}
		t.Cleanup(func() {
			if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", path, err)
			}
		})
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(h), &st); err != nil {
		t.Fatal(err)
	}
	if err := linkUp(h, "lo"); err != nil {
		t.Fatal(err)
	}
	return h, Namespace{Path: path, Dev: st.Dev, Inode: st.Ino}
}

func linkUp(h netns.NsHandle, name string) error {
	nh, err := netlink.NewHandleAt(h, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer nh.Close()
	l, err := nh.LinkByName(name)
	if err != nil {
		return err
	}
	return nh.LinkSetUp(l)
}

// addAddr puts a on the namespace's interface dev (/32), with a route to
// peer over it when peer is valid.
func addAddr(h netns.NsHandle, dev string, a, peer netip.Addr) error {
	nh, err := netlink.NewHandleAt(h, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer nh.Close()
	l, err := nh.LinkByName(dev)
	if err != nil {
		return err
	}
	if err := nh.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		return fmt.Errorf("add %s to %s: %w", a, dev, err)
	}
	if err := nh.LinkSetUp(l); err != nil {
		return err
	}
	if !peer.IsValid() {
		return nil
	}
	return nh.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Scope: netlink.SCOPE_LINK,
		Dst: &net.IPNet{IP: peer.AsSlice(), Mask: net.CIDRMask(32, 32)}})
}

// pair is a pod's namespace and a peer's, joined by a veth pair.
type pair struct {
	pod, peer         netns.NsHandle
	podNS, peerNS     Namespace
	podAddr, peerAddr netip.Addr
}

// newPair makes the two namespaces, named in dir when it is not empty;
// n picks the addresses 10.200.n.2 (pod) and 10.200.n.1 (peer).
func newPair(t testing.TB, dir string, n byte) *pair {
	t.Helper()
	p := &pair{podAddr: netip.AddrFrom4([4]byte{10, 200, n, 2}), peerAddr: netip.AddrFrom4([4]byte{10, 200, n, 1})}
	p.pod, p.podNS = newNetns(t, dir, fmt.Sprintf("pod%d", n))
	p.peer, p.peerNS = newNetns(t, dir, fmt.Sprintf("peer%d", n))
	nh, err := netlink.NewHandleAt(p.pod, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(p.peer))}
	if err := nh.LinkAdd(veth); err != nil {
		t.Fatalf("veth pair: %v", err)
	}
	if err := addAddr(p.pod, "eth0", p.podAddr, p.peerAddr); err != nil {
		t.Fatal(err)
	}
	if err := addAddr(p.peer, "eth0", p.peerAddr, p.podAddr); err != nil {
		t.Fatal(err)
	}
	return p
}

// listen listens on addr in the namespace h (network "tcp", "tcp4" or
// "tcp6" as net.Listen takes them) and accepts into the returned channel
// until the test ends.
func listen(t testing.TB, h netns.NsHandle, network, addr string) (net.Listener, <-chan net.Conn) {
	t.Helper()
	var ln net.Listener
	err := inNetns(h, func() error {
		var err error
		ln, err = net.Listen(network, addr)
		return err
	})
	if err != nil {
		t.Fatalf("listen on %s %s: %v", network, addr, err)
	}
	accepted := make(chan net.Conn, 1<<16)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		close(accepted)
		for c := range accepted {
			c.Close()
		}
	})
	return ln, accepted
}

// dial makes n connections from the namespace h to addr, closed when the
// test ends.
func dial(t testing.TB, h netns.NsHandle, addr string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	err := inNetns(h, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var d net.Dialer
		for range n {
			c, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				return err
			}
			conns = append(conns, c)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	return conns
}

// take receives n accepted connections.
func take(t testing.TB, accepted <-chan net.Conn, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	timeout := time.After(time.Minute)
	for len(conns) < n {
		select {
		case c := <-accepted:
			conns = append(conns, c)
		case <-timeout:
			t.Fatalf("accepted %d connections of %d", len(conns), n)
		}
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	return conns
}

// connFD runs f with the file descriptor of c (a connection or listener).
func connFD(c syscall.Conn, f func(fd int)) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	return raw.Control(func(fd uintptr) { f(int(fd)) })
}

// openFDs counts this process's open file descriptors.
func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
