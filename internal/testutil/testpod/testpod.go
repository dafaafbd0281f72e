package testpod

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sockscale/sockscale/internal/testutil/localroute"
	"github.com/sockscale/sockscale/internal/testutil/namedns"
)

// namePrefix marks every namespace and link this package creates, so a run
// can remove what a crashed earlier run left behind.
const namePrefix = "sstp"

// Pod is a process sandbox that looks like a pod to the node: its own
// network namespace with a veth to the host, and its own cgroup.
type Pod struct {
	// Name of the network namespace (ip netns).
	Name string
	// IP is the pod's address; HostIP the host end of its veth.
	IP, HostIP netip.Addr
	// IP6 is a dual-stack pod's IPv6 address (Options.DualStack), the
	// host end's HostIP6; invalid otherwise.
	IP6, HostIP6 netip.Addr
	// IPs are all the pod's addresses, IP first (see Options.Addresses).
	IPs []netip.Addr
	// Cgroup is the pod's cgroup v2 directory.
	Cgroup string

	hostLink string
	procs    []*exec.Cmd
}

// Options place a pod.
type Options struct {
	// Subnet picks the pod's /24: 10.213.<Subnet>.0/24, host .1, pod .2.
	// Every pod alive at the same time needs its own.
	Subnet uint8
	// CgroupParent is the cgroup v2 directory the pod's cgroup is made in.
	CgroupParent string
	// Addresses gives the pod this many addresses (.2, .3, ...; at most
	// 250), so one process can stand in for many pods. Default 1.
	Addresses int
	// IPv6 makes the pod and the host end of its link talk IPv6 only:
	// fd5c:a1e:213:<Subnet>::2, ::3, ... and ::1 in a /64 (ULA, on this
	// link only).
	IPv6 bool
	// DualStack gives an IPv4 pod one IPv6 address as well, IP6
	// (fd5c:a1e:213:<Subnet>::2, the host end ::1).
	DualStack bool
}

// New creates a pod and removes it when t ends.
func New(t testing.TB, opts Options) *Pod {
	t.Helper()
	p, err := Create(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Delete(); err != nil {
			t.Errorf("delete test pod: %v", err)
		}
	})
	return p
}

// Create makes a pod; Delete removes it. Most tests want New.
func Create(opts Options) (*Pod, error) {
	removeStale()
	id := fmt.Sprintf("%d-%d", os.Getpid(), opts.Subnet)
	p := &Pod{
		Name:     namePrefix + "-" + id,
		IP:       netip.AddrFrom4([4]byte{10, 213, opts.Subnet, 2}),
		HostIP:   netip.AddrFrom4([4]byte{10, 213, opts.Subnet, 1}),
		Cgroup:   filepath.Join(opts.CgroupParent, "pod-"+id),
		hostLink: fmt.Sprintf("%sh%d", namePrefix, opts.Subnet), // link names are at most 15 bytes
	}
	n := max(1, opts.Addresses)
	if n > 250 {
		return nil, fmt.Errorf("test pod: %d addresses, at most 250 fit its /24", n)
	}
	if opts.IPv6 && opts.DualStack {
		return nil, errors.New("test pod: IPv6 (only) and DualStack both set; choose one")
	}
	if opts.IPv6 {
		p.IP, p.HostIP = ipv6Addr(opts.Subnet, 2), ipv6Addr(opts.Subnet, 1)
	}
	for i := range n {
		a := netip.AddrFrom4([4]byte{10, 213, opts.Subnet, byte(2 + i)})
		if opts.IPv6 {
			a = ipv6Addr(opts.Subnet, byte(2+i))
		}
		p.IPs = append(p.IPs, a)
	}
	if opts.DualStack {
		p.IP6, p.HostIP6 = ipv6Addr(opts.Subnet, 2), ipv6Addr(opts.Subnet, 1)
		p.IPs = append(p.IPs, p.IP6)
	}
	if err := p.network(fmt.Sprintf("%sp%d", namePrefix, opts.Subnet)); err != nil {
		return nil, errors.Join(err, p.Delete())
	}
	if err := p.checkRoute(); err != nil {
		return nil, errors.Join(err, p.Delete())
	}
	if err := os.MkdirAll(p.Cgroup, 0o755); err != nil {
		return nil, errors.Join(fmt.Errorf("create pod cgroup: %w", err), p.Delete())
	}
	return p, nil
}

// network makes the pod's namespace and its veth: the host end hostLink
// at HostIP (its /24 or /64), the pod end podLink in the namespace with every address of
// IPs, both up, and the namespace's lo up.
func (p *Pod) network(podLink string) error {
	nsh, err := namedns.Add(p.Name)
	if err != nil {
		return err
	}
	defer func() { _ = nsh.Close() }()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p.hostLink}, PeerName: podLink, PeerNamespace: netlink.NsFd(nsh)}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s (%s in %s): %w", p.hostLink, podLink, p.Name, err)
	}
	for _, a := range []netip.Addr{p.HostIP, p.HostIP6} {
		if !a.IsValid() {
			continue
		}
		if err := netlink.AddrAdd(veth, linkAddr(a)); err != nil {
			return fmt.Errorf("add address %s to %s: %w", a, p.hostLink, err)
		}
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		return fmt.Errorf("set %s up: %w", p.hostLink, err)
	}
	// Inside the namespace through netlink sockets opened there: no thread
	// of this process changes namespace for it.
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", p.Name, err)
	}
	defer h.Close()
	pod, err := h.LinkByName(podLink)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", podLink, p.Name, err)
	}
	for _, a := range p.IPs {
		if err := h.AddrAdd(pod, linkAddr(a)); err != nil {
			return fmt.Errorf("add address %s to %s in %s: %w", a, podLink, p.Name, err)
		}
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo in %s: %w", p.Name, err)
	}
	for _, l := range []netlink.Link{pod, lo} {
		if err := h.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up in %s: %w", l.Attrs().Name, p.Name, err)
		}
	}
	return nil
}

// ipv6Addr is address host of subnet's IPv6 /64, fd5c:a1e:213:<subnet>::<host>.
func ipv6Addr(subnet, host byte) netip.Addr {
	return netip.AddrFrom16([16]byte{0xfd, 0x5c, 0x0a, 0x1e, 0x02, 0x13, 0, subnet, 15: host})
}

// linkAddr is a in its /24 (IPv4) or /64 (IPv6), for netlink. An IPv6
// address skips duplicate address detection: the link is ours alone, and
// an address still being checked could not be used for seconds.
func linkAddr(a netip.Addr) *netlink.Addr {
	if a.Is6() {
		return &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
	}
	return &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(24, 32)}}
}

// checkRoute makes sure traffic to the pod stays on this machine: the
// route to its address must be our veth, never the default route.
func (p *Pod) checkRoute() error {
	for _, a := range []netip.Addr{p.IP, p.IP6} {
		if !a.IsValid() {
			continue
		}
		if err := localroute.Check(a, localroute.Dev(p.hostLink)); err != nil {
			return fmt.Errorf("test pod %s: %w", p.Name, err)
		}
	}
	return nil
}

// Start runs the test binary in the pod with role and args (see Main), and
// waits until it is inside the pod's cgroup and listening on port (0: do
// not wait for a port, and the role listens on its own).
func (p *Pod) Start(role string, port int, args ...string) error {
	return p.StartIn(p.Cgroup, role, port, args...)
}

// StartIn is Start with the process in cgroup instead of the pod's: it
// shares the pod's network and address, but its sockets belong to cgroup,
// so programs attached above the pod's cgroup see them only if they are
// above cgroup too.
func (p *Pod) StartIn(cgroup, role string, port int, args ...string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find test binary: %w", err)
	}
	// Through `ip netns exec`, not a setns before exec: it also gives the
	// process a mount namespace of its own with /sys mounted for the pod's
	// network namespace, which Go's exec cannot do between fork and exec
	// (that would need a re-exec helper).
	cmd := exec.Command("ip", append([]string{"netns", "exec", p.Name, self}, args...)...)
	cmd.Env = append(os.Environ(), roleEnv+"="+role)
	if port != 0 {
		cmd.Env = append(cmd.Env, portEnv+"="+strconv.Itoa(port))
	}
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	gate, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s in pod: %w", role, err)
	}
	p.procs = append(p.procs, cmd)
	// ip netns exec execs our binary in place, so this pid is the server.
	// It waits on stdin until it is in its cgroup: every socket it opens
	// then belongs to that cgroup.
	if err := os.WriteFile(filepath.Join(cgroup, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		return fmt.Errorf("move %s into cgroup %s: %w", role, cgroup, err)
	}
	if _, err := io.WriteString(gate, "go\n"); err != nil {
		return fmt.Errorf("release %s: %w", role, err)
	}
	if port == 0 {
		return nil
	}
	return p.WaitListening(port, 10*time.Second)
}

// PIDs are the pod's processes that Start and Adopt gave it, in order.
func (p *Pod) PIDs() []int {
	pids := make([]int, 0, len(p.procs))
	for _, cmd := range p.procs {
		pids = append(pids, cmd.Process.Pid)
	}
	return pids
}

// Adopt makes cmd, started in the pod by the caller, one of the pod's
// processes: Delete kills it.
func (p *Pod) Adopt(cmd *exec.Cmd) { p.procs = append(p.procs, cmd) }

// WaitListening waits until something in the pod accepts connections on
// port.
func (p *Pod) WaitListening(port int, timeout time.Duration) error {
	addr := p.Addr(port)
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing in pod %s listens on %s: %w", p.Name, addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Addr is the pod's address with port, for dialling.
func (p *Pod) Addr(port int) string {
	return netip.AddrPortFrom(p.IP, uint16(port)).String()
}

// Addr6 is a dual-stack pod's IPv6 address with port, for dialling.
func (p *Pod) Addr6(port int) string {
	return netip.AddrPortFrom(p.IP6, uint16(port)).String()
}

// Delete stops the pod's processes and removes its namespace, link and
// cgroup. It is safe to call twice.
func (p *Pod) Delete() error {
	var errs []error
	for _, cmd := range p.procs {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	}
	p.procs = nil
	if err := namedns.Delete(p.Name); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	// Deleting the namespace deletes the pod's veth end and so the pair;
	// delete the host end too in case the namespace never got it.
	_ = delLink(p.hostLink)
	if p.Cgroup != "" {
		if err := removeCgroup(p.Cgroup); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeCgroup removes an empty cgroup, waiting briefly for killed
// processes to leave it.
func removeCgroup(dir string) error {
	var err error
	for range 50 {
		err = os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("remove pod cgroup: %w", err)
}

// removeStale deletes namespaces left by test processes that are gone.
func removeStale() {
	names, err := namedns.List()
	if err != nil {
		return
	}
	for _, name := range names {
		rest, ok := strings.CutPrefix(name, namePrefix+"-")
		if !ok {
			continue
		}
		pidStr, subnet, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || processAlive(pid) {
			continue
		}
		_ = namedns.Delete(name)
		_ = delLink(namePrefix + "h" + subnet)
	}
}

func processAlive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

// delLink deletes the host's link name.
func delLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err == nil {
		err = netlink.LinkDel(l)
	}
	if err != nil {
		return fmt.Errorf("delete link %s: %w", name, err)
	}
	return nil
}

// waitForGate blocks until the parent says the process is in its cgroup.
func waitForGate() {
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
}
