//go:build linux

package connaudit

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/sockscale/sockscale/agent/internal/podwatch"
	"github.com/sockscale/sockscale/bpf"
	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
	"github.com/sockscale/sockscale/internal/testutil/namedns"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// benchPods is a node's pods as a benchmark fakes them.
type benchPods []netip.Addr

func (p benchPods) Accounted() []netip.Addr                { return p }
func (p benchPods) Lookup(netip.Addr) (podwatch.Pod, bool) { return podwatch.Pod{}, true }

// BenchmarkCheckNode checks a node of 250 pods holding 10,000 open server
// connections between them (40 each), as the agent does every
// --connection-audit-period: the cost of one check (wall and CPU), and
// the share of a core it takes at the default period. Each pod is a
// network namespace with its address on lo; its clients close their ends
// at once, so the server connections stay open (CLOSE_WAIT, which the
// programs count as open too) without a client descriptor each. The
// programs are attached at an empty cgroup, so every connection is one
// they never saw: the first check learns them all, and the checks
// measured find them learned (the agent's steady state differs only in
// where each socket's state comes from).
func BenchmarkCheckNode(b *testing.B) {
	const pods, perPod = 250, 40
	testenv.RequireRoot(b)
	cg2, err := cgroup2.Root()
	if err != nil {
		b.Fatal(err)
	}
	root := filepath.Join(cg2, fmt.Sprintf("sockscale-bench-audit-%d", os.Getpid()))
	if err := os.MkdirAll(root, 0o755); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.Remove(root) })
	acct, err := bpf.New(bpf.Options{CgroupRoot: root})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = acct.Close() })

	var ips benchPods
	for i := range pods {
		ip := netip.AddrFrom4([4]byte{10, 251, byte(i / 250), byte(1 + i%250)})
		name := fmt.Sprintf("sstb-%d-%d", os.Getpid(), i)
		ns, err := namedns.Add(name)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { ns.Close(); _ = namedns.Delete(name) })
		if err := podOnLoopback(ns, ip); err != nil {
			b.Fatal(err)
		}
		if err := acct.AddPod(ip, uint64(i+1)); err != nil {
			b.Fatal(err)
		}
		servers, err := openServerConns(b, ns, ip, perPod)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			for _, c := range servers {
				c.Close()
			}
		})
		ips = append(ips, ip)
	}

	a := New(acct, ips, Options{Period: time.Hour})
	a.CheckAll() // learns them all
	learned := 0
	for _, r := range a.last {
		learned += r.Unseen
	}
	if learned != pods*perPod {
		b.Fatalf("first check learned %d connections, want %d", learned, pods*perPod)
	}
	cpu0 := cpuTime()
	for b.Loop() {
		a.CheckAll()
	}
	cpu := (cpuTime() - cpu0) / time.Duration(b.N)
	for ip, r := range a.last {
		if r.Learned != perPod || r.Miscounted() != 0 {
			b.Fatalf("pod %s: %+v, want %d learned, nothing miscounted", ip, r, perPod)
		}
	}
	b.ReportMetric(float64(cpu.Microseconds())/1000, "cpu-ms/check")
	b.ReportMetric(100*cpu.Seconds()/300, "%core@5m") // the default period
	b.ReportMetric(pods*perPod, "conns")
}

// podOnLoopback gives namespace ns the address ip on lo, up.
func podOnLoopback(ns netns.NsHandle, ip netip.Addr) error {
	h, err := netlink.NewHandleAt(ns, syscall.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := h.LinkSetUp(lo); err != nil {
		return err
	}
	return h.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}})
}

// openServerConns listens at ip:8080 in ns and opens n connections to it whose
// clients close at once: it returns the n server ends, open (CLOSE_WAIT).
func openServerConns(b *testing.B, ns netns.NsHandle, ip netip.Addr, n int) ([]net.Conn, error) {
	var servers []net.Conn
	err := inNetns(ns, func() error {
		l, err := net.Listen("tcp4", netip.AddrPortFrom(ip, 8080).String())
		if err != nil {
			return err
		}
		b.Cleanup(func() { l.Close() })
		for range n {
			c, err := net.Dial("tcp4", l.Addr().String())
			if err != nil {
				return err
			}
			s, err := l.Accept()
			if err != nil {
				return err
			}
			c.Close()
			servers = append(servers, s)
		}
		return nil
	})
	return servers, err
}

// inNetns runs f on a thread in ns: the sockets f makes are ns's.
func inNetns(ns netns.NsHandle, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		err = f()
		if serr := netns.Set(orig); serr != nil {
			errc <- errors.Join(err, serr) // the thread stays locked and ends with the goroutine
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
