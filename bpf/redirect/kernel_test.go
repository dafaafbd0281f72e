//go:build linux

package redirect

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"net"
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
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

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

func newKernelEnv(t *testing.T, pinDir string) *kernelEnv {
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
	e.r = e.attach(t, pinDir)
	e.enter(t)
	return e
}

// attach loads and attaches a Redirect at the root and closes it when t
// ends.
func (e *kernelEnv) attach(t *testing.T, pinDir string) *Redirect {
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
func (e *kernelEnv) enter(t *testing.T) {
	t.Helper()
	cg2, err := cgroup2.Root()
	if err != nil {
		t.Fatal(err)
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var orig string
	for _, line := range strings.Split(string(own), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			orig = filepath.Join(cg2, rest)
		}
	}
	if orig == "" {
		t.Fatalf("no cgroup v2 line in /proc/self/cgroup:\n%s", own)
	}
	if orig == e.client {
		return
	}
	moveSelf(t, e.client)
	t.Cleanup(func() { moveSelf(t, orig) })
}

// leave moves this process to the cgroup v2 root, outside the subtree,
// where nothing is redirected; enter brings it back.
func (e *kernelEnv) leave(t *testing.T) {
	t.Helper()
	cg2, err := cgroup2.Root()
	if err != nil {
		t.Fatal(err)
	}
	moveSelf(t, cg2)
}

func moveSelf(t *testing.T, cgroup string) {
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

// serve listens on ip at port (0: any free port) until t ends.
func serve(t testing.TB, name string, ip netip.Addr, port uint16) *server {
	t.Helper()
	ln, err := net.Listen("tcp4", netip.AddrPortFrom(ip, port).String())
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
	c, err := net.DialTimeout("tcp4", addr.String(), 2*time.Second)
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
	in4, ok := sa.(*unix.SockaddrInet4)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("getpeername: %T, want an IPv4 address", sa)
	}
	return netip.AddrPortFrom(netip.AddrFrom4(in4.Addr), uint16(in4.Port)), nil
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
}

func newServices(t *testing.T, n int) *services {
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

func redirectedCount(t *testing.T, r *Redirect, svc netip.AddrPort) uint64 {
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
	for name, prog := range map[string]*ebpf.Program{"connect4": r.objs.SockscaleConnect4, "getpeername4": r.objs.SockscaleGetpeername4} {
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

func TestKernelWeights(t *testing.T) {
	e := newKernelEnv(t, "")
	s := newServices(t, 4)
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
	if n := attachedPrograms(t, e.root); n != 2 {
		t.Errorf("after the restart %d programs are attached at the root, want 2 (one per hook)", n)
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
	if n := attachedPrograms(t, e.root); n != 2 {
		t.Errorf("after the upgrades %d programs are attached, want 2", n)
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
