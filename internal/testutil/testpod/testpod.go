package testpod

import (
	"bufio"
	"context"
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
	podLink := fmt.Sprintf("%sp%d", namePrefix, opts.Subnet)
	steps := [][]string{
		{"netns", "add", p.Name},
		{"link", "add", p.hostLink, "type", "veth", "peer", "name", podLink},
		{"link", "set", podLink, "netns", p.Name},
		{"addr", "add", p.HostIP.String() + "/24", "dev", p.hostLink},
		{"link", "set", p.hostLink, "up"},
		{"-n", p.Name, "addr", "add", p.IP.String() + "/24", "dev", podLink},
		{"-n", p.Name, "link", "set", podLink, "up"},
		{"-n", p.Name, "link", "set", "lo", "up"},
	}
	n := max(1, opts.Addresses)
	if n > 250 {
		return nil, fmt.Errorf("test pod: %d addresses, at most 250 fit its /24", n)
	}
	for i := range n {
		a := netip.AddrFrom4([4]byte{10, 213, opts.Subnet, byte(2 + i)})
		p.IPs = append(p.IPs, a)
		if i > 0 {
			steps = append(steps, []string{"-n", p.Name, "addr", "add", a.String() + "/24", "dev", podLink})
		}
	}
	for _, args := range steps {
		if err := ip(args...); err != nil {
			return nil, errors.Join(err, p.Delete())
		}
	}
	if err := p.checkRoute(); err != nil {
		return nil, errors.Join(err, p.Delete())
	}
	if err := os.MkdirAll(p.Cgroup, 0o755); err != nil {
		return nil, errors.Join(fmt.Errorf("create pod cgroup: %w", err), p.Delete())
	}
	return p, nil
}

// checkRoute makes sure traffic to the pod stays on this machine: the
// route to its address must be our veth, never the default route.
func (p *Pod) checkRoute() error {
	out, err := exec.Command("ip", "route", "get", p.IP.String()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip route get %s: %w: %s", p.IP, err, out)
	}
	if !strings.Contains(string(out), "dev "+p.hostLink+" ") {
		return fmt.Errorf("route to test pod %s does not use its veth %s (refusing to send traffic off the machine): %s", p.IP, p.hostLink, out)
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

// Delete stops the pod's processes and removes its namespace, link and
// cgroup. It is safe to call twice.
func (p *Pod) Delete() error {
	var errs []error
	for _, cmd := range p.procs {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
	}
	p.procs = nil
	if err := ip("netns", "del", p.Name); err != nil && !strings.Contains(err.Error(), "No such file") {
		errs = append(errs, err)
	}
	// Deleting the namespace deletes the pod's veth end and so the pair;
	// delete the host end too in case the namespace never got it.
	_ = ip("link", "del", p.hostLink)
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
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		rest, ok := strings.CutPrefix(name, namePrefix+"-")
		if !ok {
			continue
		}
		pidStr, subnet, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if err != nil || processAlive(pid) {
			continue
		}
		_ = ip("netns", "del", name)
		_ = ip("link", "del", namePrefix+"h"+subnet)
	}
}

func processAlive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

func ip(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// waitForGate blocks until the parent says the process is in its cgroup.
func waitForGate() {
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
}
