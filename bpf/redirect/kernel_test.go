//go:build linux

package redirect

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
	"github.com/sockscale/sockscale/internal/testutil/testpod"
)

func TestMain(m *testing.M) {
	testpod.Main() // returns unless this process is a test pod's server
	os.Exit(m.Run())
}

// The tests connect from this process. A cgroup program sees the sockets
// of processes below the cgroup it is attached at, so each test makes a
// cgroup subtree, attaches at its root and moves this process into a child
// (its "client pod") for as long as it connects; the servers it connects
// to are listeners of this process on loopback addresses, which never leave
// the machine (localAddr checks the route).

// kernelEnv is a cgroup subtree with the redirect attached at its root.
type kernelEnv struct {
	root   string // the attach point
	client string // root/client, where this process connects from
	r      *Redirect
}

func newKernelEnv(t testing.TB, pinDir string) *kernelEnv {
	t.Helper()
	e := newCgroupEnv(t)
	e.r = e.attach(t, pinDir)
	e.enter(t)
	return e
}

// newCgroupEnv is the cgroup subtree without a Redirect, this process
// still outside it.
func newCgroupEnv(t testing.TB) *kernelEnv {
	t.Helper()
	testenv.RequireRoot(t)
	cg2, err := cgroup2.Root()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(cg2, fmt.Sprintf("sockscale-redirect-test-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "_")))
	e := &kernelEnv{root: root, client: filepath.Join(root, "client")}
	if err := os.MkdirAll(e.client, 0o755); err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: leave the client cgroup, close, remove both.
	t.Cleanup(func() { _ = os.Remove(root) })
	t.Cleanup(func() { _ = os.Remove(e.client) })
	return e
}

// attach loads and attaches a Redirect at the root and closes it when t
// ends.
func (e *kernelEnv) attach(t testing.TB, pinDir string) *Redirect {
	t.Helper()
	r, err := New(Options{CgroupRoot: e.root, PinDir: pinDir})
	if err != nil {
		t.Fatalf("attach redirect: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// enter moves this process into the client cgroup until leave or the end
// of t.
func (e *kernelEnv) enter(t testing.TB) {
	t.Helper()
	orig, err := cgroup2.Own()
	if err != nil {
		t.Fatal(err)
	}
	if orig == e.client {
		return
	}
	moveSelf(t, e.client)
	t.Cleanup(func() { moveSelf(t, orig) })
}

// leave moves this process to the cgroup v2 root, outside the subtree,
// where nothing is redirected; enter brings it back.
func (e *kernelEnv) leave(t testing.TB) {
	t.Helper()
	cg2, err := cgroup2.Root()
	if err != nil {
		t.Fatal(err)
	}
	moveSelf(t, cg2)
}

func moveSelf(t testing.TB, cgroup string) {
	t.Helper()
	// cgroup.procs moves the whole process, every thread of it.
	if err := os.WriteFile(filepath.Join(cgroup, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatalf("move this process into %s: %v", cgroup, err)
	}
}

// localAddr returns addr after checking that traffic to it stays on this
// machine: the kernel must route it to the loopback device.
func localAddr(t testing.TB, addr string) netip.Addr {
	t.Helper()
	a := netip.MustParseAddr(addr)
	out, err := exec.Command("ip", "route", "get", a.String()).CombinedOutput()
	if err != nil {
		t.Fatalf("ip route get %s: %v: %s", a, err, out)
	}
	if !strings.HasPrefix(string(out), "local "+a.String()+" ") || !strings.Contains(string(out), " dev lo ") {
		t.Fatalf("%s is not routed to the loopback device (refusing to send test traffic off the machine): %s", a, out)
	}
	return a
}

// server accepts TCP connections and writes its name to each, then closes
// it.
type server struct {
	name    string
	addr    netip.AddrPort
	accepts atomic.Int64
}

// serve listens on ip (IPv4 or IPv6) at port (0: any free port) until t
// ends.
func serve(t testing.TB, name string, ip netip.Addr, port uint16) *server {
	t.Helper()
	network := "tcp4"
	if ip.Is6() {
		network = "tcp6"
	}
	ln, err := net.Listen(network, netip.AddrPortFrom(ip, port).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	s := &server{name: name, addr: netip.MustParseAddrPort(ln.Addr().String())}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.accepts.Add(1)
			go func() {
				defer c.Close()
				_, _ = c.Write([]byte(name + "\n"))
			}()
		}
	}()
	return s
}

// dialResult is one connect: who answered and what getpeername said.
type dialResult struct {
	backend    string // the answering server's name
	peer       netip.AddrPort
	start, end time.Time // before connect(), after the answer
	err        error
}

// dial connects to addr, reads the answering server's name and closes.
func dial(addr netip.AddrPort) (res dialResult) {
	res.start = time.Now()
	defer func() { res.end = time.Now() }()
	c, err := net.DialTimeout("tcp", addr.String(), 2*time.Second)
	if err != nil {
		res.err = err
		return res
	}
	defer c.Close()
	res.peer, res.err = peerName(c.(*net.TCPConn))
	if res.err != nil {
		return res
	}
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	name, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		res.err = fmt.Errorf("read server name: %w", err)
		return res
	}
	res.backend = strings.TrimSuffix(name, "\n")
	return res
}

// peerName is getpeername(2) on c's socket.
func peerName(c syscallConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var sa unix.Sockaddr
	var serr error
	if err := raw.Control(func(fd uintptr) { sa, serr = unix.Getpeername(int(fd)) }); err != nil {
		return netip.AddrPort{}, err
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("getpeername: %w", serr)
	}
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port)), nil
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port)), nil
	}
	return netip.AddrPort{}, fmt.Errorf("getpeername: %T, want an IP address", sa)
}

type syscallConn interface {
	SyscallConn() (syscall.RawConn, error)
}

// mustDial dials and fails t on an error.
func mustDial(t testing.TB, addr netip.AddrPort) dialResult {
	t.Helper()
	res := dial(addr)
	if res.err != nil {
		t.Fatalf("dial %s: %v", addr, res.err)
	}
	return res
}

// attachedPrograms counts our programs attached at a cgroup, as bpftool
// reports them.
func attachedPrograms(t *testing.T, cgroup string) int {
	t.Helper()
	out, err := exec.Command("bpftool", "cgroup", "show", cgroup).CombinedOutput()
	if err != nil {
		t.Fatalf("bpftool cgroup show: %v: %s", err, out)
	}
	return strings.Count(string(out), "sockscale_")
}

// pinDir is a fresh directory on the bpffs for t, uninstalled at its end.
func pinDir(t *testing.T) string {
	t.Helper()
	testenv.RequireRoot(t)
	if err := testenv.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	dir := fmt.Sprintf("/sys/fs/bpf/sockscale-redirect-test-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "_"))
	t.Cleanup(func() { _ = Uninstall(dir) })
	return dir
}

// services is a Service address answered directly by a server of its own
// ("direct": what kube-proxy would give a client without the redirect), and
// backends answering as "backend-0", ... on other loopback addresses.
type services struct {
	svc      netip.AddrPort
	direct   *server
	backends []*server
	v6       *v6Link // newServices6's, for more addresses
}

func newServices(t testing.TB, n int) *services {
	t.Helper()
	s := &services{direct: serve(t, "direct", localAddr(t, "127.77.0.1"), 0)}
	s.svc = s.direct.addr
	for i := range n {
		s.backends = append(s.backends, serve(t, "backend-"+strconv.Itoa(i), localAddr(t, fmt.Sprintf("127.77.1.%d", i+1)), 0))
	}
	return s
}

// weighted gives backend i weight weights[i].
func (s *services) weighted(weights ...uint32) []Backend {
	out := make([]Backend, len(weights))
	for i, w := range weights {
		out[i] = Backend{Addr: s.backends[i].addr, Weight: w}
	}
	return out
}

func TestKernelRedirect(t *testing.T) {
	e := newKernelEnv(t, "")
	s := newServices(t, 1)
	logProgramSizes(t, e.r)

	// No entry: the connect goes where it was sent.
	if got := mustDial(t, s.svc); got.backend != "direct" || got.peer != s.svc {
		t.Fatalf("without an entry: answered by %s, peer %s; want direct, %s", got.backend, got.peer, s.svc)
	}
	if err := e.r.Set(s.svc, s.weighted(1)); err != nil {
		t.Fatal(err)
	}
	const n = 20
	for range n {
		got := mustDial(t, s.svc)
		if got.backend != "backend-0" {
			t.Fatalf("with an entry: answered by %s, want backend-0", got.backend)
		}
		// The client sees the address it dialled, not the backend's.
		if got.peer != s.svc {
			t.Fatalf("getpeername = %s, want the dialled %s", got.peer, s.svc)
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

	// A process outside the subtree is not redirected.
	e.leave(t)
	if got := mustDial(t, s.svc); got.backend != "direct" {
		t.Errorf("from outside the attach root: answered by %s, want direct", got.backend)
	}
	e.enter(t)

	// Delete: connects go where they were sent again; the counter stays.
	if err := e.r.Delete(s.svc); err != nil {
		t.Fatal(err)
	}
	if got := mustDial(t, s.svc); got.backend != "direct" || got.peer != s.svc {
		t.Errorf("after Delete: answered by %s, peer %s; want direct, %s", got.backend, got.peer, s.svc)
	}
	if err := e.r.Delete(s.svc); err != nil {
		t.Errorf("deleting again: %v, want nil", err)
	}
	if got := redirectedCount(t, e.r, s.svc); got != n {
		t.Errorf("after Delete redirected = %d, want still %d", got, n)
	}
	if err := e.r.Forget(s.svc); err != nil {
		t.Fatal(err)
	}
	if counts, err := e.r.Redirected(); err != nil || len(counts) != 0 {
		t.Errorf("after Forget Redirected() = %v, %v; want empty", counts, err)
	}
	if ev, err := e.r.Events(); err != nil || ev != (Events{}) {
		t.Errorf("Events() = %+v, %v; want none", ev, err)
	}
	if s.backends[0].accepts.Load() != n {
		t.Errorf("backend accepted %d connections, want %d", s.backends[0].accepts.Load(), n)
	}
}

var addrPortComparer = cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })

func redirectedCount(t testing.TB, r *Redirect, svc netip.AddrPort) uint64 {
	t.Helper()
	counts, err := r.Redirected()
	if err != nil {
		t.Fatal(err)
	}
	return counts[svc]
}

// logProgramSizes logs each program's instructions after loading and how
// many the verifier processed.
func logProgramSizes(t *testing.T, r *Redirect) {
	t.Helper()
	for name, prog := range map[string]*ebpf.Program{
		"connect4": r.objs.SockscaleConnect4, "getpeername4": r.objs.SockscaleGetpeername4,
		"connect6": r.objs.SockscaleConnect6, "getpeername6": r.objs.SockscaleGetpeername6,
	} {
		info, err := prog.Info()
		if err != nil {
			t.Fatal(err)
		}
		insns, err := info.Instructions()
		if err != nil {
			t.Logf("%s: %v", name, err)
			continue
		}
		verified, _ := info.VerifiedInstructions()
		t.Logf("%s: %d instructions, %d processed by the verifier", name, len(insns), verified)
	}
}

// TestKernelWeights: connects are shared by weight, for an IPv4 Service
// (connect4) and an IPv6 one (connect6).
func TestKernelWeights(t *testing.T) {
	e := newKernelEnv(t, "")
	t.Run("IPv4", func(t *testing.T) { testWeights(t, e, newServices(t, 4)) })
	t.Run("IPv6", func(t *testing.T) { testWeights(t, e, newServices6(t, 4)) })
}

func testWeights(t *testing.T, e *kernelEnv, s *services) {
	for _, tc := range []struct {
		name    string
		weights []uint32
		n       int
	}{
		{"activators", []uint32{1, 1, 1, 1}, 2000},
		{"split", []uint32{1, 2, 5}, 2000},
		{"canary", []uint32{99, 1}, 2000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := e.r.Set(s.svc, s.weighted(tc.weights...)); err != nil {
				t.Fatal(err)
			}
			counts := map[string]int{}
			for range tc.n {
				counts[mustDial(t, s.svc).backend]++
			}
			total := 0.0
			for _, w := range tc.weights {
				total += float64(w)
			}
			for i, w := range tc.weights {
				p := float64(w) / total
				mean, sd := float64(tc.n)*p, math.Sqrt(float64(tc.n)*p*(1-p))
				got := counts[s.backends[i].name]
				// Five standard deviations: a correct split fails once in
				// 1.7 million runs per backend.
				if math.Abs(float64(got)-mean) > 5*sd {
					t.Errorf("backend %d (weight %d of %.0f): %d of %d connects, want %.0f ± %.0f (5 sd)", i, w, total, got, tc.n, mean, 5*sd)
				}
			}
			if counts["direct"] != 0 {
				t.Errorf("%d connects went to the Service address", counts["direct"])
			}
			t.Logf("weights %v: %v", tc.weights, counts)
		})
	}
}

func TestKernelUDPUntouched(t *testing.T) {
	e := newKernelEnv(t, "")
	s := newServices(t, 1)
	if err := e.r.Set(s.svc, s.weighted(1)); err != nil {
		t.Fatal(err)
	}
	// UDP servers on the Service's and the backend's addresses and ports
	// that answer with their names.
	udpServe := func(name string, at netip.AddrPort) {
		pc, err := net.ListenPacket("udp4", at.String())
		if err != nil {
			t.Skipf("UDP %s is taken: %v", at, err) // only if another process holds the same port
		}
		t.Cleanup(func() { pc.Close() })
		go func() {
			buf := make([]byte, 64)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo([]byte(name), from)
			}
		}()
	}
	udpServe("direct", s.svc)
	udpServe("backend-0", s.backends[0].addr)

	c, err := net.Dial("udp4", s.svc.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if peer, err := peerName(c.(*net.UDPConn)); err != nil || peer != s.svc {
		t.Errorf("UDP getpeername = %s, %v; want %s", peer, err, s.svc)
	}
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(buf[:n]); got != "direct" {
		t.Errorf("UDP datagram answered by %s, want direct (UDP is never redirected)", got)
	}
	if got := redirectedCount(t, e.r, s.svc); got != 0 {
		t.Errorf("redirected = %d after a UDP connect, want 0", got)
	}
}

// connectLoop dials svc back to back until stopped, recording each connect.
type connectLoop struct {
	mu      sync.Mutex
	results []dialResult
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

func startConnectLoop(svc netip.AddrPort) *connectLoop {
	l := &connectLoop{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for {
			select {
			case <-l.stop:
				return
			default:
			}
			res := dial(svc)
			l.mu.Lock()
			l.results = append(l.results, res)
			l.mu.Unlock()
		}
	}()
	return l
}

// since returns the results from index i on.
func (l *connectLoop) since(i int) []dialResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.results[min(i, len(l.results)):])
}

func (l *connectLoop) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.results)
}

// Stop ends the loop (once) and returns every result.
func (l *connectLoop) Stop() []dialResult {
	l.once.Do(func() { close(l.stop) })
	<-l.done
	return l.since(0)
}

// TestKernelSwitchVisibleToNextConnect switches a Service between two
// backends while a client connects back to back: every connect that starts
// after Set returned goes to the new backend. It logs how long Set takes
// and how long from calling Set until a connect has reached the new backend
// (which includes waiting for the loop's next connect and that connect).
func TestKernelSwitchVisibleToNextConnect(t *testing.T) {
	e := newKernelEnv(t, "")
	s := newServices(t, 2)
	if err := e.r.Set(s.svc, s.weighted(1)); err != nil {
		t.Fatal(err)
	}
	loop := startConnectLoop(s.svc)
	defer loop.Stop()
	const switches = 100
	var setTimes, switchTimes []time.Duration
	for i := range switches {
		to := (i + 1) % 2
		want := s.backends[to].name
		time.Sleep(time.Duration(i%7) * 300 * time.Microsecond) // switch at varying phases of the loop
		mark := loop.len()
		t0 := time.Now()
		if err := e.r.Set(s.svc, []Backend{{Addr: s.backends[to].addr, Weight: 1}}); err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		setTimes = append(setTimes, t1.Sub(t0))
		deadline := time.Now().Add(5 * time.Second)
		reached := time.Time{}
		for after := 0; after < 3; {
			if time.Now().After(deadline) {
				t.Fatalf("switch %d: no three connects after Set within 5 s", i)
			}
			after = 0
			for _, r := range loop.since(mark) {
				if r.err != nil {
					t.Fatalf("switch %d: %v", i, r.err)
				}
				if r.backend == want && reached.IsZero() {
					reached = r.end
				}
				if r.start.After(t1) {
					after++
					if r.backend != want {
						t.Fatalf("switch %d: a connect that started %v after Set returned went to %s, want %s", i, r.start.Sub(t1), r.backend, want)
					}
				}
			}
			time.Sleep(100 * time.Microsecond)
		}
		switchTimes = append(switchTimes, reached.Sub(t0))
	}
	results := loop.Stop()
	t.Logf("%d switches, %d connects: Set %s; Set called -> a connect reached the new backend %s",
		switches, len(results), percentiles(setTimes), percentiles(switchTimes))
}

func percentiles(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[int(math.Ceil(q*float64(len(s))))-1] }
	return fmt.Sprintf("p50 %v p99 %v max %v", at(0.50), at(0.99), s[len(s)-1])
}

func TestKernelAgentRestartKeepsEntries(t *testing.T) {
	pins := pinDir(t)
	e := newKernelEnv(t, pins)
	s := newServices(t, 2)
	want := map[netip.AddrPort][]Backend{s.svc: s.weighted(3, 1)}
	if err := e.r.Set(s.svc, want[s.svc]); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		mustDial(t, s.svc)
	}
	// The agent stops: its fds close, the pins keep everything attached.
	if err := e.r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.r.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	for range 10 {
		if got := mustDial(t, s.svc); got.backend == "direct" || got.peer != s.svc {
			t.Fatalf("with no agent running: answered by %s, peer %s; want a backend, %s", got.backend, got.peer, s.svc)
		}
	}
	// A new agent finds the entries, the counters and one attachment.
	e.r = e.attach(t, pins)
	entries, err := e.r.Entries()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, entries, addrPortComparer); diff != "" {
		t.Errorf("Entries after the restart (-want +got):\n%s", diff)
	}
	if got := redirectedCount(t, e.r, s.svc); got != 20 {
		t.Errorf("redirected = %d after the restart, want 20", got)
	}
	if got := mustDial(t, s.svc); got.backend == "direct" {
		t.Errorf("after the restart: answered by direct, want a backend")
	}
	if n := attachedPrograms(t, e.root); n != len(attachments) {
		t.Errorf("after the restart %d programs are attached at the root, want %d (one per hook)", n, len(attachments))
	}
	if err := e.r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := Uninstall(pins); err != nil {
		t.Fatal(err)
	}
	if n := attachedPrograms(t, e.root); n != 0 {
		t.Errorf("after Uninstall %d programs are attached, want 0", n)
	}
	if got := mustDial(t, s.svc); got.backend != "direct" {
		t.Errorf("after Uninstall: answered by %s, want direct", got.backend)
	}
	if _, err := os.Stat(pins); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin directory still there after Uninstall: %v", err)
	}
	var nilRedirect *Redirect
	if err := nilRedirect.Close(); err != nil {
		t.Errorf("Close on nil: %v", err)
	}
}

// TestKernelUpgradeWithoutGap replaces the programs twice while a client
// connects back to back: a build with the same map layout (the pinned maps
// stay, the links swap programs) and one with another layout (the entries
// are copied into new maps before the swap). No connect may go to the
// Service address itself.
func TestKernelUpgradeWithoutGap(t *testing.T) {
	pins := pinDir(t)
	current := mapsLayout
	mapsLayout = func(*ebpf.CollectionSpec) (string, error) { return layoutPrefix + "previous", nil } // an older build's layout
	e := newKernelEnv(t, pins)
	mapsLayout = current
	s := newServices(t, 3)
	if err := e.r.Set(s.svc, s.weighted(1, 1, 1)); err != nil {
		t.Fatal(err)
	}
	old := e.r
	loop := startConnectLoop(s.svc)
	defer loop.Stop()
	wait := func(n int) {
		for mark := loop.len(); loop.len() < mark+n; {
			time.Sleep(time.Millisecond)
		}
	}
	wait(200)
	// Another layout: new maps, entries copied, links swapped, old maps removed.
	migrateStart := time.Now()
	e.r = e.attach(t, pins)
	migrateEnd := time.Now()
	_ = old.Close() // the old agent is gone
	wait(200)
	// The same layout: maps reused, links swapped.
	again := e.attach(t, pins)
	_ = e.r.Close()
	e.r = again
	wait(200)
	results := loop.Stop()

	counts := map[string]int{}
	for _, r := range results {
		if r.err != nil {
			t.Fatalf("connect failed during the upgrade: %v", r.err)
		}
		counts[r.backend]++
	}
	t.Logf("%d connects across two upgrades: %v", len(results), counts)
	if counts["direct"] != 0 {
		t.Errorf("%d connects went to the Service address during the upgrades, want 0", counts["direct"])
	}
	if n := attachedPrograms(t, e.root); n != len(attachments) {
		t.Errorf("after the upgrades %d programs are attached, want %d", n, len(attachments))
	}
	if _, err := os.Stat(filepath.Join(pins, layoutPrefix+"previous")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the previous layout's maps are still pinned: %v", err)
	}
	entries, err := e.r.Entries()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[netip.AddrPort][]Backend{s.svc: s.weighted(1, 1, 1)}, entries, addrPortComparer); diff != "" {
		t.Errorf("Entries after the upgrades (-want +got):\n%s", diff)
	}
	// The counters are copied before the programs are swapped: a connect
	// in between counts in the old maps only, so the count may miss those
	// that overlapped the layout-changing New, and no others.
	overlapped := 0
	for _, r := range results {
		if r.end.After(migrateStart) && r.start.Before(migrateEnd) {
			overlapped++
		}
	}
	if got := redirectedCount(t, e.r, s.svc); got > uint64(len(results)) || got+uint64(overlapped) < uint64(len(results)) {
		t.Errorf("redirected = %d, want the %d connects, less at most the %d that overlapped the copy", got, len(results), overlapped)
	}
}

// rawConnect connects a new TCP socket of family to sa with connect(2), so
// the test controls the socket's family and can connect it twice.
func rawConnect(t *testing.T, family int, sa unix.Sockaddr) (int, error) {
	t.Helper()
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	tv := unix.NsecToTimeval((2 * time.Second).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	return fd, unix.Connect(fd, sa)
}

// readName reads the answering server's name from fd.
func readName(t *testing.T, fd int) string {
	t.Helper()
	var name []byte
	buf := make([]byte, 64)
	for !strings.HasSuffix(string(name), "\n") {
		n, err := unix.Read(fd, buf)
		if err != nil || n == 0 {
			t.Fatalf("read server name: %d bytes, %v", n, err)
		}
		name = append(name, buf[:n]...)
	}
	return strings.TrimSuffix(string(name), "\n")
}

func mapped(a netip.AddrPort) *unix.SockaddrInet6 {
	return &unix.SockaddrInet6{Addr: netip.AddrFrom16(a.Addr().As16()).As16(), Port: int(a.Port())}
}

// TestKernelDualStackSockets: a client that opens IPv6 sockets for IPv4
// destinations (Java, .NET) dials ::ffff:<Service address>; connect6 and
// getpeername6 treat it like connect4 and getpeername4. IPv6 without an
// entry stays untouched.
func TestKernelDualStackSockets(t *testing.T) {
	e := newKernelEnv(t, "")
	s := newServices(t, 1)
	if err := e.r.Set(s.svc, s.weighted(1)); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		fd, err := rawConnect(t, unix.AF_INET6, mapped(s.svc))
		if err != nil {
			t.Fatalf("connect to %v: %v", mapped(s.svc).Addr, err)
		}
		if got := readName(t, fd); got != "backend-0" {
			t.Errorf("dual-stack connect to ::ffff:%s answered by %s, want backend-0", s.svc, got)
		}
		sa, err := unix.Getpeername(fd)
		if err != nil {
			t.Fatal(err)
		}
		in6 := sa.(*unix.SockaddrInet6)
		if got := netip.AddrPortFrom(netip.AddrFrom16(in6.Addr).Unmap(), uint16(in6.Port)); got != s.svc || !netip.AddrFrom16(in6.Addr).Is4In6() {
			t.Errorf("getpeername = [%v]:%d, want ::ffff:%s", netip.AddrFrom16(in6.Addr), in6.Port, s.svc)
		}
	}
	if got := redirectedCount(t, e.r, s.svc); got != 5 {
		t.Errorf("redirected = %d, want 5", got)
	}
	// Plain IPv6, on loopback, no entry: as it was.
	v6 := serve6(t)
	if got := mustDial(t, v6.addr); got.backend != "v6" || got.peer != v6.addr {
		t.Errorf("IPv6 connect to %s: answered by %s, peer %s", v6.addr, got.backend, got.peer)
	}
}

func serve6(t *testing.T) *server {
	t.Helper()
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	s := &server{name: "v6", addr: netip.MustParseAddrPort(ln.Addr().String())}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("v6\n"))
			c.Close()
		}
	}()
	return s
}

// TestKernelReconnectAfterFailedRedirect: a socket whose redirected connect
// failed and that then connects elsewhere reports its real peer.
func TestKernelReconnectAfterFailedRedirect(t *testing.T) {
	e := newKernelEnv(t, "")
	s := newServices(t, 0)
	other := serve(t, "other", localAddr(t, "127.77.0.2"), 0)
	// A backend nobody listens on: the connect is refused at once.
	ln, err := net.Listen("tcp4", localAddr(t, "127.77.1.9").String()+":0")
	if err != nil {
		t.Fatal(err)
	}
	closed := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close()
	if err := e.r.Set(s.svc, []Backend{{Addr: closed, Weight: 1}}); err != nil {
		t.Fatal(err)
	}
	svc4 := &unix.SockaddrInet4{Addr: s.svc.Addr().As4(), Port: int(s.svc.Port())}
	fd, err := rawConnect(t, unix.AF_INET, svc4)
	if !errors.Is(err, unix.ECONNREFUSED) {
		t.Fatalf("connect to %s redirected to the closed %s: %v, want ECONNREFUSED", s.svc, closed, err)
	}
	to := &unix.SockaddrInet4{Addr: other.addr.Addr().As4(), Port: int(other.addr.Port())}
	if err := unix.Connect(fd, to); err != nil {
		t.Fatalf("connect the same socket again, to %s: %v", other.addr, err)
	}
	if got := readName(t, fd); got != "other" {
		t.Errorf("second connect answered by %s, want other", got)
	}
	sa, err := unix.Getpeername(fd)
	if err != nil {
		t.Fatal(err)
	}
	in4 := sa.(*unix.SockaddrInet4)
	if got := netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port)); got != other.addr {
		t.Errorf("getpeername = %s, want the real peer %s (not the first connect's %s)", got, other.addr, s.svc)
	}
}

// podSubnet is the test pod's /24 (10.213.92.0/24): no other package's
// tests use it, so they may run at the same time.
const podSubnet = 92

// TestKernelRedirectToPod is the production shape: the Service address is a
// "ClusterIP" nothing answers (an unused address of the pod's /24, routed
// to the pod's veth), the backend a server in another network namespace,
// the client an HTTP client that knows only the Service address.
func TestKernelRedirectToPod(t *testing.T) {
	e := newKernelEnv(t, "")
	pod := testpod.New(t, testpod.Options{Subnet: podSubnet, CgroupParent: e.root})
	if err := pod.Start(testpod.RoleHTTP, testpod.HTTPPort); err != nil {
		t.Fatal(err)
	}
	svc := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 213, podSubnet, 200}), 80)
	out, err := exec.Command("ip", "route", "get", svc.Addr().String()).CombinedOutput()
	if err != nil || !strings.Contains(string(out), fmt.Sprintf(" dev sstph%d ", podSubnet)) {
		t.Fatalf("%s is not routed to the test pod's veth (refusing to send test traffic off the machine): %v: %s", svc.Addr(), err, out)
	}
	if err := e.r.Set(svc, []Backend{{Addr: netip.AddrPortFrom(pod.IP, testpod.HTTPPort), Weight: 1}}); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for range 3 {
		resp, err := client.Get("http://" + svc.String() + "/?size=5")
		if err != nil {
			t.Fatalf("GET the Service address: %v", err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || string(body) != "abcde" {
			t.Fatalf("GET the Service address: %d %q %v, want 200 \"abcde\"", resp.StatusCode, body, err)
		}
	}
	// Without the entry the connect goes to the Service address, where
	// nothing answers.
	if err := e.r.Delete(svc); err != nil {
		t.Fatal(err)
	}
	if c, err := net.DialTimeout("tcp", svc.String(), 300*time.Millisecond); err == nil {
		c.Close()
		t.Errorf("after Delete a connect to %s succeeded; nothing listens there", svc)
	}
}

// BenchmarkKernelConnect measures loopback connects (connect, accept, one
// line, close) without the programs in the path, with them and no entry
// (the one hash miss every other connect on a node pays), and redirected.
// ns/connect4 is the program's own run time per connect, from the kernel's
// BPF run-time statistics.
func BenchmarkKernelConnect(b *testing.B) {
	e := newKernelEnv(b, "")
	s := newServices(b, 1)
	plain := serve(b, "plain", localAddr(b, "127.77.0.3"), 0)
	if err := e.r.Set(s.svc, s.weighted(1)); err != nil {
		b.Fatal(err)
	}
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatal(err)
	}
	defer stats.Close()
	for _, bc := range []struct {
		name     string
		attached bool
		addr     netip.AddrPort
		want     string
	}{
		{"no program", false, plain.addr, "plain"},
		{"miss", true, plain.addr, "plain"},
		{"redirected", true, s.svc, "backend-0"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			if bc.attached {
				e.enter(b)
			} else {
				e.leave(b)
			}
			st0, err := e.r.objs.SockscaleConnect4.Stats()
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if res := dial(bc.addr); res.err != nil || res.backend != bc.want {
					b.Fatalf("dial %s: answered by %q, %v; want %s", bc.addr, res.backend, res.err, bc.want)
				}
			}
			st1, err := e.r.objs.SockscaleConnect4.Stats()
			if err != nil {
				b.Fatal(err)
			}
			if runs := st1.RunCount - st0.RunCount; runs > 0 {
				b.ReportMetric(float64(st1.Runtime-st0.Runtime)/float64(runs), "ns/connect4")
			}
		})
	}
}

// BenchmarkKernelSet measures one entry update (the agent's switch of a
// Service between two activator sets).
func BenchmarkKernelSet(b *testing.B) {
	e := newKernelEnv(b, "")
	svc := netip.MustParseAddrPort("10.96.0.10:80")
	sets := [2][]Backend{}
	for i := range sets {
		for j := range 3 {
			sets[i] = append(sets[i], Backend{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(i), byte(j + 1)}), 8012), Weight: 1})
		}
	}
	i := 0
	for b.Loop() {
		if err := e.r.Set(svc, sets[i%2]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// TestKernelRootMoved: an agent started with another cgroup root attaches
// there first and then detaches the pinned links from the old root.
func TestKernelRootMoved(t *testing.T) {
	pins := pinDir(t)
	e := newKernelEnv(t, pins)
	s := newServices(t, 1)
	if err := e.r.Set(s.svc, s.weighted(1)); err != nil {
		t.Fatal(err)
	}
	if err := e.r.Close(); err != nil {
		t.Fatal(err)
	}
	moved := e.root + "-moved"
	if err := os.Mkdir(moved, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(moved) })
	r, err := New(Options{CgroupRoot: moved, PinDir: pins})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	if n := attachedPrograms(t, e.root); n != 0 {
		t.Errorf("%d programs still attached at the old root, want 0", n)
	}
	if n := attachedPrograms(t, moved); n != len(attachments) {
		t.Errorf("%d programs attached at the new root, want %d", n, len(attachments))
	}
	// The client is below the old root only: no longer redirected. The
	// entry is still there for clients below the new one.
	if got := mustDial(t, s.svc); got.backend != "direct" {
		t.Errorf("below the old root: answered by %s, want direct", got.backend)
	}
	if entries, err := r.Entries(); err != nil || len(entries) != 1 {
		t.Errorf("Entries() = %v, %v; want the one entry", entries, err)
	}
}

// TestKernelPinDirShared: the redirect may share the accounting's PinDir. It
// detaches its own links of hooks it no longer has, and neither New nor
// Uninstall touch another component's pins.
func TestKernelPinDirShared(t *testing.T) {
	pins := pinDir(t)
	e := newKernelEnv(t, pins)
	// Another component's pins, named like the accounting's.
	if err := os.Mkdir(filepath.Join(pins, "objects-0123"), 0o700); err != nil {
		t.Fatal(err)
	}
	foreignPins := []string{"link_sockops", "objects-0123/pod_slots"}
	t.Cleanup(func() { // before pinDir's Uninstall, which leaves them
		for _, name := range append(foreignPins, "objects-0123") {
			_ = os.Remove(filepath.Join(pins, name))
		}
	})
	for _, name := range foreignPins {
		// One map per pin: pinning a pinned map again moves its pin.
		foreign, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer foreign.Close()
		if err := foreign.Pin(filepath.Join(pins, name)); err != nil {
			t.Fatal(err)
		}
	}
	// A link an older build pinned for a hook this one does not have.
	old, err := link.AttachCgroup(link.CgroupOptions{Path: e.root, Attach: ebpf.AttachCgroupInet4GetPeername, Program: e.r.objs.SockscaleGetpeername4})
	if err != nil {
		t.Fatal(err)
	}
	if err := old.Pin(filepath.Join(pins, linkPrefix+"getsockname4")); err != nil {
		t.Fatal(err)
	}
	old.Close()
	if n := attachedPrograms(t, e.root); n != len(attachments)+1 {
		t.Fatalf("%d programs attached, want %d", n, len(attachments)+1)
	}

	if err := e.r.Close(); err != nil {
		t.Fatal(err)
	}
	e.r = e.attach(t, pins)
	if n := attachedPrograms(t, e.root); n != len(attachments) {
		t.Errorf("after New %d programs are attached, want %d: the stale link stays", n, len(attachments))
	}
	if err := e.r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := Uninstall(pins); err != nil {
		t.Fatal(err)
	}
	if n := attachedPrograms(t, e.root); n != 0 {
		t.Errorf("after Uninstall %d programs are attached, want 0", n)
	}
	left, err := os.ReadDir(pins)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range left {
		names = append(names, l.Name())
	}
	if diff := cmp.Diff([]string{"link_sockops", "objects-0123"}, names); diff != "" {
		t.Errorf("left in the shared PinDir after Uninstall (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Join(pins, "objects-0123", "pod_slots")); err != nil {
		t.Errorf("another component's map pin: %v", err)
	}
}

// TestKernelSplitToProxiedRevision: a split's backend that is a Service
// address with an entry of its own (a revision at zero, in Proxy mode) is
// followed to that entry's backend; each entry counts the connect. A cycle
// of entries ends after MaxHops.
func TestKernelSplitToProxiedRevision(t *testing.T) {
	e := newKernelEnv(t, "")
	route := newServices(t, 1)                                      // the split's address, an activator
	revision := serve(t, "revision", localAddr(t, "127.77.0.2"), 0) // a revision's Service address
	if err := e.r.Set(route.svc, []Backend{{Addr: revision.addr, Weight: 1}}); err != nil {
		t.Fatal(err)
	}
	if got := mustDial(t, route.svc); got.backend != "revision" || got.peer != route.svc {
		t.Fatalf("split to a revision in Serve mode: answered by %s, peer %s; want revision, %s", got.backend, got.peer, route.svc)
	}
	// The revision goes to Proxy mode: the connect goes on to the activator.
	if err := e.r.Set(revision.addr, route.weighted(1)); err != nil {
		t.Fatal(err)
	}
	if got := mustDial(t, route.svc); got.backend != "backend-0" || got.peer != route.svc {
		t.Errorf("split to a revision in Proxy mode: answered by %s, peer %s; want backend-0, %s", got.backend, got.peer, route.svc)
	}
	counts, err := e.r.Redirected()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[netip.AddrPort]uint64{route.svc: 2, revision.addr: 1}, counts, addrPortComparer); diff != "" {
		t.Errorf("Redirected (-want +got):\n%s", diff)
	}
	// A cycle: route -> revision -> route stops after two entries, at the
	// route's own address.
	if err := e.r.Set(revision.addr, []Backend{{Addr: route.svc, Weight: 1}}); err != nil {
		t.Fatal(err)
	}
	if got := mustDial(t, route.svc); got.backend != "direct" {
		t.Errorf("an entry cycle: answered by %s, want direct (the route's address after %d hops)", got.backend, MaxHops)
	}
}

// TestKernelLease: entries are followed only while the lease holds. A
// lapsed lease sends connects where they were dialled (kube-proxy's path),
// counts them as lease_expired, and a renewal brings the redirect back;
// a New with a lease over pinned maps renews it before attaching.
func TestKernelLease(t *testing.T) {
	dir := pinDir(t)
	e := newKernelEnv(t, dir)
	s := newServices(t, 1)
	if err := e.r.Set(s.svc, s.weighted(1)); err != nil {
		t.Fatal(err)
	}
	if got := mustDial(t, s.svc); got.backend != "backend-0" {
		t.Fatalf("without a lease (Options.Lease 0): answered by %s, want backend-0", got.backend)
	}
	if err := e.r.Renew(50 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got := mustDial(t, s.svc); got.backend != "backend-0" {
		t.Fatalf("within the lease: answered by %s, want backend-0", got.backend)
	}
	time.Sleep(100 * time.Millisecond)
	for range 3 {
		if got := mustDial(t, s.svc); got.backend != "direct" || got.peer != s.svc {
			t.Fatalf("after the lease lapsed: answered by %s, peer %s; want direct, %s", got.backend, got.peer, s.svc)
		}
	}
	if ev, err := e.r.Events(); err != nil || ev != (Events{LeaseExpired: 3}) {
		t.Errorf("Events() = %+v, %v; want 3 lease_expired", ev, err)
	}
	if err := e.r.Renew(time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := mustDial(t, s.svc); got.backend != "backend-0" {
		t.Errorf("after a renewal: answered by %s, want backend-0", got.backend)
	}
	if err := e.r.Renew(0); err == nil {
		t.Error("Renew(0) = nil, want an error naming the ttl")
	}

	// An agent that restarts after its lease lapsed: New renews before its
	// programs run, so the pinned entries are followed at once.
	if err := e.r.Renew(time.Nanosecond); err != nil {
		t.Fatal(err)
	}
	if got := mustDial(t, s.svc); got.backend != "direct" {
		t.Fatalf("lapsed again: answered by %s, want direct", got.backend)
	}
	r2, err := New(Options{CgroupRoot: e.root, PinDir: dir, Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r2.Close() })
	if got := mustDial(t, s.svc); got.backend != "backend-0" {
		t.Errorf("after New with a lease over the pinned map: answered by %s, want backend-0", got.backend)
	}
}
