//go:build linux

package bpf

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
	"github.com/sockscale/sockscale/internal/testutil/testpod"
)

func TestMain(m *testing.M) {
	testpod.Main()        // returns unless this process is a test pod's server
	capabilityProbeMain() // returns unless this process is a capability probe
	followServerMain()    // returns unless this process is the follow server
	podClientMain()       // returns unless this process is a pod's client
	os.Exit(m.Run())
}

// kernelEnv is a cgroup subtree with the accounting attached at its root,
// and a pod below it serving HTTP.
type kernelEnv struct {
	root string // the attach point
	acct *Accounting
	pod  *testpod.Pod
}

var nextSubnet atomic.Uint32

func newKernelEnv(t *testing.T, pinDir string) *kernelEnv {
	t.Helper()
	return newFamilyEnv(t, pinDir, false)
}

// newFamilyEnv is newKernelEnv whose pod talks IPv6 if ipv6 is set.
func newFamilyEnv(t *testing.T, pinDir string, ipv6 bool) *kernelEnv {
	t.Helper()
	testenv.RequireRoot(t)
	cg2, err := cgroup2.Root()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(cg2, fmt.Sprintf("sockscale-test-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "_")))
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(root) }) // after the pod's cleanup removed its cgroup
	e := &kernelEnv{root: root}
	e.pod = testpod.New(t, testpod.Options{Subnet: uint8(100 + nextSubnet.Add(1)%100), CgroupParent: root, IPv6: ipv6})
	e.acct = e.attach(t, pinDir)
	if err := e.acct.AddPod(e.pod.IP, 1); err != nil {
		t.Fatal(err)
	}
	if err := e.pod.Start(testpod.RoleHTTP, testpod.HTTPPort); err != nil {
		t.Fatal(err)
	}
	return e
}

// inFamilies runs test with its pod on IPv4, then with its pod on IPv6:
// the same counts are wanted of both.
func inFamilies(t *testing.T, test func(t *testing.T, ipv6 bool)) {
	for _, f := range []struct {
		name string
		ipv6 bool
	}{{"IPv4", false}, {"IPv6", true}} {
		t.Run(f.name, func(t *testing.T) { test(t, f.ipv6) })
	}
}

func (e *kernelEnv) attach(t *testing.T, pinDir string) *Accounting {
	t.Helper()
	a, err := New(Options{CgroupRoot: e.root, PinDir: pinDir})
	if err != nil {
		t.Fatalf("attach accounting: %v", err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

func (e *kernelEnv) counters(t *testing.T) (PodCounters, time.Duration) {
	t.Helper()
	s, err := e.acct.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return s.Pods[e.pod.IP], s.At
}

// waitCounters polls until cond holds for the pod's counters (the kernel
// sees a connection's end a moment after the client does).
func (e *kernelEnv) waitCounters(t *testing.T, what string, cond func(PodCounters) bool) PodCounters {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, _ := e.counters(t)
		if cond(c) {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: never held; last counters %+v", what, c)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (e *kernelEnv) url(query string) string {
	return "http://" + e.pod.Addr(testpod.HTTPPort) + "/?" + query
}

func TestKernelConcurrencyAccuracy(t *testing.T) {
	inFamilies(t, testConcurrencyAccuracy)
}

func testConcurrencyAccuracy(t *testing.T, ipv6 bool) {
	e := newFamilyEnv(t, "", ipv6)
	// Long enough that what the client spends outside the server (its own
	// scheduling, a new connection's set-up) stays well under 1 % of a
	// request even on a busy 2-core machine. With 200 ms, 64 clients
	// without keep-alive lost 1.2-2.7 % of their time outside the server
	// here (dialling, and goroutines waiting for a CPU to send or to read),
	// which is not server concurrency but counted against the offered 64;
	// with 400 ms still up to 1.9 %.
	const sleep = 800 * time.Millisecond
	var total int64
	for _, keepAlive := range []bool{true, false} {
		for _, c := range []int{1, 8, 64} {
			t.Run(fmt.Sprintf("c=%d keepalive=%v", c, keepAlive), func(t *testing.T) {
				load := loadgen.Start(context.Background(), loadgen.Options{URLs: []string{e.url("sleep=" + sleep.String())}, Concurrency: c, KeepAlive: keepAlive, Spans: true})
				time.Sleep(300 * time.Millisecond) // every client in its loop
				c0, at0 := e.counters(t)
				wall0 := time.Now()
				time.Sleep(2 * time.Second)
				c1, at1 := e.counters(t)
				wall1 := time.Now()
				res := load.Stop()

				window := (at1 - at0).Seconds()
				measured := (c1.Requests.Area - c0.Requests.Area).Seconds() / window
				little := res.InFlightArea(wall0, wall1).Seconds() / wall1.Sub(wall0).Seconds()
				t.Logf("offered %d, measured %.3f (%+.2f%%), client-side %.3f (%+.2f%%), %d requests",
					c, measured, 100*(measured-float64(c))/float64(c), little, 100*(measured-little)/little, c1.Requests.Completed-c0.Requests.Completed)
				// Without keep-alive each request's time at the client also
				// holds a new connection's set-up, which the server never
				// sees: with 64 clients on this 2-core box, while other test
				// packages ran, it reached 1.9-2.4 % (CI, measured and
				// client-side alike). The 2 % target itself is measured by
				// `make bench` on an idle machine; here 3 % still catches a
				// request lost or counted twice (1/64 = 1.6 % per client).
				limit := 0.02
				if !keepAlive {
					limit = 0.03
				}
				if rel := math.Abs(measured-float64(c)) / float64(c); rel > limit {
					t.Errorf("measured concurrency %.3f is %.1f%% off the offered %d (limit %.0f%%)", measured, 100*rel, c, 100*limit)
				}
				if rel := math.Abs(measured-little) / little; rel > limit {
					t.Errorf("measured concurrency %.3f is %.1f%% off the client's Little's law %.3f (limit %.0f%%)", measured, 100*rel, little, 100*limit)
				}
				if res.Failed > 0 {
					t.Errorf("%d requests failed", res.Failed)
				}
				total += res.Completed
			})
		}
	}
	got := e.waitCounters(t, "every request completed", func(c PodCounters) bool { return c.Requests.InFlight == 0 })
	if int64(got.Requests.Started) != total || int64(got.Requests.Completed) != total {
		t.Errorf("started=%d completed=%d, want both = the client's %d", got.Requests.Started, got.Requests.Completed, total)
	}
}

func TestKernelIdleKeepAliveIsNotLoad(t *testing.T) {
	e := newKernelEnv(t, "")
	// The pod's readiness dial was a connection too; count from its end.
	base := e.waitCounters(t, "readiness dial closed", func(c PodCounters) bool { return c.ConnsInFlight == 0 })
	const n = 10
	var conns []net.Conn
	for range n {
		c, err := net.Dial("tcp", e.pod.Addr(testpod.HTTPPort))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: pod\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		buf := make([]byte, 4096)
		if _, err := c.Read(buf); err != nil { // the response (small: one read)
			t.Fatal(err)
		}
	}
	got := e.waitCounters(t, "responses done", func(c PodCounters) bool { return c.Requests.Completed == n })
	if got.ConnsInFlight != n || got.Requests.InFlight != 0 || got.Requests.Started != n {
		t.Errorf("idle keep-alive: conns in flight=%d requests in flight=%d started=%d, want %d, 0, %d",
			got.ConnsInFlight, got.Requests.InFlight, got.Requests.Started, n, n)
	}
	for _, c := range conns {
		c.Close()
	}
	e.waitCounters(t, "connections closed", func(c PodCounters) bool { return c.ConnsInFlight == 0 && c.ConnsTotal == base.ConnsTotal+n })
}

// TestKernelProbesAreNotLoad: requests with the kubelet's User-Agent from
// the node (the test's client, at the host's address, made a node address)
// are probes; the same requests from a client that is not the node are
// load, as a pod that sent them to hide its load would be.
func TestKernelProbesAreNotLoad(t *testing.T) {
	inFamilies(t, testProbesAreNotLoad)
}

func testProbesAreNotLoad(t *testing.T, ipv6 bool) {
	e := newFamilyEnv(t, "", ipv6)
	if err := e.acct.SetNodeAddrs([]netip.Addr{e.pod.HostIP}); err != nil {
		t.Fatal(err)
	}
	probes := loadgen.Options{URLs: []string{e.url("")}, Concurrency: 2, KeepAlive: true, Header: http.Header{"User-Agent": {"kube-probe/1.36"}}}
	load := loadgen.Run(probes, 500*time.Millisecond)
	got := e.waitCounters(t, "probes counted", func(c PodCounters) bool { return int64(c.ProbesTotal) == load.Completed })
	if got.Requests.Started != 0 || got.Requests.Area != 0 {
		t.Errorf("probes counted as load: started=%d area=%v", got.Requests.Started, got.Requests.Area)
	}
	if load.Completed == 0 {
		t.Fatal("no probe completed")
	}

	if err := e.acct.SetNodeAddrs(nil); err != nil {
		t.Fatal(err)
	}
	// On kept-alive connections and on a new one for each request (the
	// kubelet's way, whose first bytes may reach the listener first).
	var spoofed int64
	for _, keepAlive := range []bool{true, false} {
		probes.KeepAlive = keepAlive
		spoofed += loadgen.Run(probes, 500*time.Millisecond).Completed
		after := e.waitCounters(t, "spoofed probes counted as load", func(c PodCounters) bool {
			return int64(c.Requests.Completed) == spoofed
		})
		if after.ProbesTotal != got.ProbesTotal || spoofed == 0 {
			t.Errorf("keep-alive %t: a client that is not the node: %d requests with a probe's User-Agent, %d counted as probes, %d as load", keepAlive, spoofed, after.ProbesTotal-got.ProbesTotal, after.Requests.Completed)
		}
	}
}

func TestKernelResponseFramings(t *testing.T) {
	e := newKernelEnv(t, "")
	queries := []string{
		"size=0", "size=10", "size=4000000", // large: many GSO segments
		"chunked=1&size=0", "chunked=1&size=100", "chunked=1&size=3000000",
		"close=1&size=100", "close=1&chunked=1&size=100000",
	}
	client := &http.Client{Timeout: 30 * time.Second}
	for range 3 {
		for _, q := range queries {
			resp, err := client.Get(e.url(q))
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	n := uint64(3 * len(queries))
	got := e.waitCounters(t, "all responses complete", func(c PodCounters) bool { return c.Requests.Completed == n })
	if got.Requests.Started != n || got.Requests.InFlight != 0 || got.OpaqueConnsTotal != 0 {
		t.Errorf("started=%d in flight=%d opaque=%d, want %d, 0, 0", got.Requests.Started, got.Requests.InFlight, got.OpaqueConnsTotal, n)
	}
	ev, err := e.acct.Events()
	if err != nil {
		t.Fatal(err)
	}
	if ev != (Events{}) {
		t.Errorf("events = %+v, want none", ev)
	}
}

func TestKernelProxiedRequests(t *testing.T) {
	inFamilies(t, testProxiedRequests)
}

func testProxiedRequests(t *testing.T, ipv6 bool) {
	e := newFamilyEnv(t, "", ipv6)
	if err := e.acct.SetActivators([]netip.Addr{e.pod.HostIP}); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		resp, err := http.Get(e.url("size=1"))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	got := e.waitCounters(t, "proxied requests", func(c PodCounters) bool { return c.Proxied.Completed == 5 })
	if got.Requests.Completed != 5 || got.Proxied.Started != 5 {
		t.Errorf("requests completed=%d proxied started=%d, want 5 and 5", got.Requests.Completed, got.Proxied.Started)
	}
	if err := e.acct.SetActivators(nil); err != nil {
		t.Fatal(err)
	}
	// A connection keeps the marking it got when accepted: use a new one.
	http.DefaultClient.CloseIdleConnections()
	resp, err := http.Get(e.url("size=1"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	http.DefaultClient.CloseIdleConnections()
	got = e.waitCounters(t, "direct request", func(c PodCounters) bool { return c.Requests.Completed == 6 })
	if got.Proxied.Started != 5 {
		t.Errorf("after removing the activator, proxied started=%d, want still 5", got.Proxied.Started)
	}
}

func TestKernelOpaqueConnections(t *testing.T) {
	e := newKernelEnv(t, "")
	if err := e.pod.Start(testpod.RoleEcho, testpod.EchoPort); err != nil {
		t.Fatal(err)
	}
	// The readiness dial above was a connection too; start from its end.
	base := e.waitCounters(t, "readiness dials closed", func(c PodCounters) bool { return c.ConnsInFlight == 0 })
	c, err := net.Dial("tcp", e.pod.Addr(testpod.EchoPort))
	if err != nil {
		t.Fatal(err)
	}
	hello := "\x16\x03\x01\x00\x2a\x01\x00\x00\x26\x03\x03" // a TLS ClientHello's start
	if _, err := io.WriteString(c, hello); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, len(hello))); err != nil {
		t.Fatal(err)
	}
	got := e.waitCounters(t, "opaque connection", func(p PodCounters) bool { return p.OpaqueConnsInFlight == 1 })
	if got.Requests.InFlight != 1 || got.OpaqueConnsTotal != base.OpaqueConnsTotal+1 {
		t.Errorf("open TLS connection: requests in flight=%d opaque total=%d, want 1 and %d", got.Requests.InFlight, got.OpaqueConnsTotal, base.OpaqueConnsTotal+1)
	}
	c.Close()
	e.waitCounters(t, "opaque connection released", func(p PodCounters) bool {
		return p.OpaqueConnsInFlight == 0 && p.Requests.InFlight == 0 && p.ConnsInFlight == 0
	})
}

func TestKernelAgentRestartLosesNothing(t *testing.T) {
	testenv.RequireRoot(t)
	if err := testenv.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	pinDir := fmt.Sprintf("/sys/fs/bpf/sockscale-test-%d", os.Getpid())
	t.Cleanup(func() { _ = Uninstall(pinDir) })
	e := newKernelEnv(t, pinDir)

	load := loadgen.Start(context.Background(), loadgen.Options{URLs: []string{e.url("sleep=20ms")}, Concurrency: 8, KeepAlive: true})
	time.Sleep(time.Second)
	// The agent stops (its fds close; the pins keep everything attached)
	// and a new one starts while requests are in flight.
	if err := e.acct.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	e.acct = e.attach(t, pinDir)
	time.Sleep(time.Second)
	res := load.Stop()

	got := e.waitCounters(t, "load done", func(c PodCounters) bool { return c.Requests.InFlight == 0 })
	if int64(got.Requests.Started) != res.Completed || int64(got.Requests.Completed) != res.Completed {
		t.Errorf("across the restart: started=%d completed=%d, want both = the client's %d", got.Requests.Started, got.Requests.Completed, res.Completed)
	}
	if n := attachedPrograms(t, e.root); n != 3 {
		t.Errorf("after the restart %d programs are attached at the root, want 3 (one per hook)", n)
	}
	if err := e.acct.Close(); err != nil {
		t.Fatal(err)
	}
	if err := Uninstall(pinDir); err != nil {
		t.Fatal(err)
	}
	if n := attachedPrograms(t, e.root); n != 0 {
		t.Errorf("after Uninstall %d programs are attached, want 0", n)
	}
	if _, err := os.Stat(pinDir); !os.IsNotExist(err) {
		t.Errorf("pin directory still there after Uninstall: %v", err)
	}
}

// attachedPrograms counts the programs attached at a cgroup, as bpftool
// reports them.
func attachedPrograms(t *testing.T, cgroup string) int {
	t.Helper()
	out, err := exec.Command("bpftool", "cgroup", "show", cgroup).CombinedOutput()
	if err != nil {
		t.Fatalf("bpftool cgroup show: %v: %s", err, out)
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "sockscale_") {
			n++
		}
	}
	return n
}

func TestKernelUpgradeDetachesPreviousVersion(t *testing.T) {
	testenv.RequireRoot(t)
	if err := testenv.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	pinDir := fmt.Sprintf("/sys/fs/bpf/sockscale-test-upgrade-%d", os.Getpid())
	t.Cleanup(func() { _ = Uninstall(pinDir) })
	current := objectsVersion
	objectsVersion = objectsPrefix + "previous" // what an older agent pinned
	e := newKernelEnv(t, pinDir)
	objectsVersion = current
	if err := e.acct.Close(); err != nil {
		t.Fatal(err)
	}

	// The new version attaches its own programs and detaches the old ones.
	e.acct = e.attach(t, pinDir)
	if n := attachedPrograms(t, e.root); n != 3 {
		t.Errorf("after the upgrade %d programs are attached, want 3", n)
	}
	if _, err := os.Stat(filepath.Join(pinDir, objectsPrefix+"previous")); !os.IsNotExist(err) {
		t.Errorf("the previous version's pins are still there: %v", err)
	}
	// The new maps start empty: the agent adds its pods again and counts.
	if err := e.acct.AddPod(e.pod.IP, 1); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(e.url("size=1"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	e.waitCounters(t, "the new version counts", func(c PodCounters) bool { return c.Requests.Completed == 1 })
}

// TestKernelRootMoved: an agent started with another cgroup root than the
// one its pinned links are attached at (the node moved to an agent pool
// with its own cgroupRoot, say the kubelet's subtree) attaches there, and
// only there: the old root's links go, the pinned maps and their pods stay.
func TestKernelRootMoved(t *testing.T) {
	testenv.RequireRoot(t)
	if err := testenv.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	pinDir := fmt.Sprintf("/sys/fs/bpf/sockscale-test-moved-%d", os.Getpid())
	t.Cleanup(func() { _ = Uninstall(pinDir) })
	e := newKernelEnv(t, pinDir)
	if err := e.acct.Close(); err != nil {
		t.Fatal(err)
	}

	// Below the old root, above the pod: it still sees the pod's sockets.
	moved := e.pod.Cgroup
	a, err := New(Options{CgroupRoot: moved, PinDir: pinDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	e.acct = a
	if n := attachedPrograms(t, e.root); n != 0 {
		t.Errorf("%d programs still attached at the old root, want 0", n)
	}
	if n := attachedPrograms(t, moved); n != 3 {
		t.Errorf("%d programs attached at the new root, want 3 (one per hook)", n)
	}
	// The pod added before the move is still accounted, once.
	resp, err := http.Get(e.url("size=1"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	e.waitCounters(t, "counted at the new root", func(c PodCounters) bool { return c.Requests.Completed >= 1 })
	time.Sleep(100 * time.Millisecond)
	if c, _ := e.counters(t); c.Requests.Completed != 1 || c.Requests.Started != 1 {
		t.Errorf("one request counted started=%d completed=%d, want 1 and 1", c.Requests.Started, c.Requests.Completed)
	}
}

// TestKernelSlowHeadersAreNotLoad: a request counts from the end of its
// headers, the point from which a server serves it (Knative's queue-proxy
// counts from there too), so clients that send their headers slowly hold
// no place in the count meanwhile, however long they take.
func TestKernelSlowHeadersAreNotLoad(t *testing.T) {
	e := newKernelEnv(t, "")
	const slow = 20
	const sleep = 100 * time.Millisecond
	conns := make([]net.Conn, slow)
	for i := range conns {
		c, err := net.Dial("tcp", e.pod.Addr(testpod.HTTPPort))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		conns[i] = c
		if _, err := fmt.Fprintf(c, "GET /?sleep=%s HTTP/1.1\r\nHost: pod\r\n", sleep); err != nil {
			t.Fatal(err)
		}
	}
	before := e.waitCounters(t, "slow clients connected", func(c PodCounters) bool { return c.ConnsInFlight == slow })
	// A header line from each client every 250 ms, for a second.
	for i := range 4 {
		time.Sleep(250 * time.Millisecond)
		for _, c := range conns {
			if _, err := fmt.Fprintf(c, "X-Slow-%d: %s\r\n", i, strings.Repeat("s", 40)); err != nil {
				t.Fatal(err)
			}
		}
	}
	held, _ := e.counters(t)
	if held.Requests.Started != 0 || held.Requests.InFlight != 0 || held.Requests.Area != before.Requests.Area {
		t.Errorf("while %d clients sent their headers for 1 s: started=%d in flight=%d area grew by %v, want 0, 0, 0",
			slow, held.Requests.Started, held.Requests.InFlight, held.Requests.Area-before.Requests.Area)
	}

	for _, c := range conns {
		if _, err := io.WriteString(c, "\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range conns {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	done := e.waitCounters(t, "slow requests answered", func(c PodCounters) bool { return c.Requests.Completed == slow })
	// Each request was served for about its sleep after its headers' end:
	// 20 x 100 ms = 2 s in all. Counted from their first bytes they would
	// add more than 20 x 1.1 s.
	area := done.Requests.Area - held.Requests.Area
	t.Logf("%d requests whose headers took 1 s, each served for %v: area %v (from the first byte it would be > %v)", slow, sleep, area, slow*(time.Second+sleep))
	if area < slow*sleep*9/10 || area > slow*sleep*3 {
		t.Errorf("area of %d requests served %v each = %v, want about %v", slow, sleep, area, slow*sleep)
	}
}
