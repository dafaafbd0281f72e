//go:build linux

package nodeaddr

import (
	"context"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestKernelFollowsAddressChanges runs the watcher on a network namespace
// of its own: the addresses of its links at the start, then each address
// added or removed, but those of kube-ipvs0 (kube-proxy's IPVS cluster IPs)
// and loopback.
func TestKernelFollowsAddressChanges(t *testing.T) {
	testenv.RequireRoot(t)
	ns, h := newNamespace(t)
	dummy := addLink(t, h, "sockscale-n0")
	ipvs := addLink(t, h, "kube-ipvs0")
	addAddr(t, h, dummy, "10.213.9.1/24")
	addAddr(t, h, ipvs, "10.96.0.10/32")

	var mu sync.Mutex
	var last []netip.Addr
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, Options{Set: func(a []netip.Addr) error {
			mu.Lock()
			defer mu.Unlock()
			last = a
			return nil
		}, Settle: 10 * time.Millisecond}, h, ns)
	}()
	waitFor := func(want ...string) {
		t.Helper()
		w := addrs(want...)
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			mu.Lock()
			got := slices.Clone(last)
			mu.Unlock()
			if slices.Equal(got, w) {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("node addresses %v, want %v", last, w)
	}
	waitFor("10.213.9.1")
	addAddr(t, h, dummy, "10.213.10.7/24") // another subnet: deleting a primary address deletes its secondaries
	waitFor("10.213.9.1", "10.213.10.7")
	addr, _ := netlink.ParseAddr("10.213.9.1/24")
	if err := h.AddrDel(dummy, addr); err != nil {
		t.Fatalf("delete address: %v", err)
	}
	waitFor("10.213.10.7")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

// newNamespace makes a network namespace for the test (closed at its end)
// and a netlink handle in it, without moving the test's thread there.
func newNamespace(t *testing.T) (netns.NsHandle, *netlink.Handle) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatalf("current namespace: %v", err)
	}
	defer orig.Close()
	ns, err := netns.New() // moves this thread
	if err != nil {
		t.Fatalf("new namespace: %v", err)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatalf("back to the original namespace: %v", err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatalf("netlink handle: %v", err)
	}
	t.Cleanup(func() { h.Close(); ns.Close() })
	return ns, h
}

func addLink(t *testing.T, h *netlink.Handle, name string) netlink.Link {
	t.Helper()
	// A bridge: the kernel here has no dummy links.
	l := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
	if err := h.LinkAdd(l); err != nil {
		t.Fatalf("add link %s: %v", name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		t.Fatalf("set %s up: %v", name, err)
	}
	return l
}

func addAddr(t *testing.T, h *netlink.Handle, l netlink.Link, cidr string) {
	t.Helper()
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(l, a); err != nil {
		t.Fatalf("add %s to %s: %v", cidr, l.Attrs().Name, err)
	}
}
