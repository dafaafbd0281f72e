//go:build linux

package connaudit

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sockscale/sockscale/agent/internal/podwatch"
	"github.com/sockscale/sockscale/bpf"
	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
	"github.com/sockscale/sockscale/internal/testutil/testpod"
)

func TestMain(m *testing.M) {
	testpod.Main() // returns unless this process is a test pod's server
	os.Exit(m.Run())
}

// onePod is the Pods of a node with one pod.
type onePod struct{ ip netip.Addr }

func (p onePod) Accounted() []netip.Addr { return []netip.Addr{p.ip} }
func (p onePod) Lookup(ip netip.Addr) (podwatch.Pod, bool) {
	return podwatch.Pod{Namespace: "ns", Name: "pod", Workload: "app"}, ip == p.ip
}

// env is a cgroup subtree with a pod serving HTTP below it; attach loads
// the accounting at its root.
type env struct {
	root string
	pod  *testpod.Pod
	acct *bpf.Accounting
}

var nextSubnet atomic.Uint32

func newEnv(t *testing.T) *env {
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
	t.Cleanup(func() { _ = os.Remove(root) })
	e := &env{root: root}
	e.pod = testpod.New(t, testpod.Options{Subnet: uint8(200 + nextSubnet.Add(1)%50), CgroupParent: root})
	if err := e.pod.Start(testpod.RoleHTTP, testpod.HTTPPort); err != nil {
		t.Fatal(err)
	}
	return e
}

// attach loads the accounting (pinned in pinDir, if any) and adds the pod.
func (e *env) attach(t *testing.T, pinDir string) {
	t.Helper()
	a, err := bpf.New(bpf.Options{CgroupRoot: e.root, PinDir: pinDir})
	if err != nil {
		t.Fatalf("attach accounting: %v", err)
	}
	t.Cleanup(func() { _ = a.Close() })
	if err := a.AddPod(e.pod.IP, 1); err != nil {
		t.Fatal(err)
	}
	e.acct = a
}

func (e *env) conns(t *testing.T) int64 {
	t.Helper()
	s, err := e.acct.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return s.Pods[e.pod.IP].ConnsInFlight
}

func (e *env) waitConns(t *testing.T, want int64, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		got := e.conns(t)
		if got == want {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("open connections %d, want %d within %v", got, want, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// keepAlive is a client connection that sends one request at a time and
// reads each response whole.
type keepAlive struct {
	c net.Conn
	r *bufio.Reader
}

func dialKeepAlive(t *testing.T, addr string) *keepAlive {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &keepAlive{c: c, r: bufio.NewReader(c)}
}

func (k *keepAlive) get(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(k.c, "GET / HTTP/1.1\r\nHost: pod\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(k.r, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// TestKernelAuditLearnsConnectionsFromBeforeTheAgent: keep-alive
// connections opened and idle before the programs were loaded are unseen
// by them. A check (poked as the pod is added) learns them, so they count
// within one report period (1 s); the programs take each over at its next
// request or its end, and later checks find nothing to correct.
func TestKernelAuditLearnsConnectionsFromBeforeTheAgent(t *testing.T) {
	e := newEnv(t)
	var idle []*keepAlive
	for range 5 {
		k := dialKeepAlive(t, e.pod.Addr(testpod.HTTPPort))
		k.get(t)
		idle = append(idle, k)
	}
	e.attach(t, "")
	if n := e.conns(t); n != 0 {
		t.Fatalf("before any check: %d connections counted, want 0 (the programs never saw them)", n)
	}

	a := New(e.acct, onePod{e.pod.IP}, Options{Period: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Run(ctx)
	a.Poke(e.pod.IP)
	took := e.waitConns(t, 5, time.Second)
	t.Logf("idle connections from before the agent counted %v after the pod was added", took.Round(time.Millisecond))
	first := a.lastOf(e.pod.IP)
	if first.Unseen != 5 || first.Miscounted() != -5 {
		t.Errorf("first check: %+v, want 5 unseen (miscounted -5)", first)
	}

	check := func(what string, wantFollowed, wantLearned int) {
		t.Helper()
		a.CheckAll()
		r := a.lastOf(e.pod.IP)
		if r.Miscounted() != 0 || r.Followed != wantFollowed || r.Learned != wantLearned || r.Open != wantFollowed+wantLearned {
			t.Errorf("%s: %+v, want %d followed, %d learned, nothing miscounted", what, r, wantFollowed, wantLearned)
		}
	}
	check("second check", 0, 5)

	idle[0].get(t) // the programs take it over at its request
	s, _ := e.acct.Snapshot()
	if got := s.Pods[e.pod.IP]; got.ConnsInFlight != 5 || got.Requests.Completed != 1 {
		t.Errorf("after a request on a learned connection: %d connections, %d requests; want 5 and 1", got.ConnsInFlight, got.Requests.Completed)
	}
	check("after a request", 1, 4)

	// Two learned ones end: the server's FIN after the client's is seen.
	idle[1].c.Close()
	idle[2].c.Close()
	e.waitConns(t, 3, 5*time.Second)
	check("after two closed", 1, 2)
}

// lastOf returns the latest check of the pod at ip.
func (a *Auditor) lastOf(ip netip.Addr) bpf.Audit {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last[ip]
}

// TestKernelAuditFindsNothingUnderLoad: with keep-alive clients, clients
// that dial for each request and an idle flood at once, through an agent
// restart, checks every 50 ms find nothing to learn or take off, and no
// drift whenever the counters held still; once the load is over the count
// is the idle connections exactly.
func TestKernelAuditFindsNothingUnderLoad(t *testing.T) {
	e := newEnv(t)
	if err := testenv.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	pinDir := fmt.Sprintf("/sys/fs/bpf/sockscale-test-audit-%d", os.Getpid())
	t.Cleanup(func() { _ = bpf.Uninstall(pinDir) })
	e.attach(t, pinDir)

	const idleConns = 200
	var idle []*keepAlive
	for range idleConns {
		idle = append(idle, dialKeepAlive(t, e.pod.Addr(testpod.HTTPPort)))
	}
	url := "http://" + e.pod.Addr(testpod.HTTPPort) + "/?sleep=5ms"
	keep := loadgen.Start(context.Background(), loadgen.Options{URLs: []string{url}, Concurrency: 8, KeepAlive: true})
	fresh := loadgen.Start(context.Background(), loadgen.Options{URLs: []string{url}, Concurrency: 8})

	var mu sync.Mutex
	var checks, stable int
	var bad []string
	audit := func(a *Auditor) {
		a.CheckAll()
		r := a.lastOf(e.pod.IP)
		mu.Lock()
		defer mu.Unlock()
		checks++
		if r.Stable {
			stable++
		}
		if r.Unseen != 0 || r.Gone != 0 || r.Drift != 0 {
			bad = append(bad, fmt.Sprintf("%+v", r))
		}
	}
	a := New(e.acct, onePod{e.pod.IP}, Options{Period: time.Hour})
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		audit(a)
		time.Sleep(50 * time.Millisecond)
	}
	// An agent restart: a new process with the pinned maps.
	if err := e.acct.Close(); err != nil {
		t.Fatal(err)
	}
	e.attach(t, pinDir)
	a = New(e.acct, onePod{e.pod.IP}, Options{Period: time.Hour})
	deadline = time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		audit(a)
		time.Sleep(50 * time.Millisecond)
	}
	kr, fr := keep.Stop(), fresh.Stop()
	if kr.Failed+fr.Failed > 0 || kr.Completed == 0 || fr.Completed == 0 {
		t.Fatalf("load: keep-alive %d ok %d failed, fresh %d ok %d failed", kr.Completed, kr.Failed, fr.Completed, fr.Failed)
	}
	e.waitConns(t, idleConns, 5*time.Second)
	audit(a)
	r := a.lastOf(e.pod.IP)
	if r.Open != idleConns || r.Followed != idleConns || !r.Stable {
		t.Errorf("after the load: %+v, want %d open and followed, stable", r, idleConns)
	}
	t.Logf("%d checks (%d with the counters still), %d keep-alive and %d fresh requests", checks, stable, kr.Completed, fr.Completed)
	if len(bad) > 0 {
		t.Errorf("%d of %d checks corrected something:\n%s", len(bad), checks, strings.Join(bad, "\n"))
	}
	_ = idle
}
