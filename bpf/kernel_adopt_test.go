//go:build linux

package bpf

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
	"github.com/sockscale/sockscale/internal/testutil/testpod"
)

// TestKernelUpgradeKeepsCountingOpenConnections upgrades the agent under
// keep-alive load: build A (a pin directory of another version) counts 8
// clients, then build B replaces it with maps of its own, as a new build
// does, while the clients keep sending on the same connections. B must
// count them as connections and their requests from their next request on
// (before: 0 requests and 0 connections until they reconnected), and see
// them close (A asked sock_ops for their state changes).
func TestKernelUpgradeKeepsCountingOpenConnections(t *testing.T) {
	testenv.RequireRoot(t)
	if err := testenv.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	pinDir := fmt.Sprintf("/sys/fs/bpf/sockscale-test-upgrade-load-%d", os.Getpid())
	t.Cleanup(func() { _ = Uninstall(pinDir) })
	current := objectsVersion
	objectsVersion = objectsPrefix + "previous" // build A
	e := newKernelEnv(t, pinDir)
	objectsVersion = current
	base := e.waitCounters(t, "readiness dial closed", func(c PodCounters) bool { return c.ConnsInFlight == 0 })

	const clients = 8
	client := loadgen.NewClient(clients, true)
	defer client.CloseIdleConnections()
	load := loadgen.Start(context.Background(), loadgen.Options{URLs: []string{e.url("sleep=5ms")}, Concurrency: clients, KeepAlive: true, Client: client})
	e.waitCounters(t, "build A counts the clients", func(c PodCounters) bool {
		return c.ConnsInFlight == clients && c.Requests.Completed > base.Requests.Completed+100
	})

	// The upgrade: the old agent stops, the new build attaches with maps of
	// its own (removing A's) and the agent adds its pods to them.
	if err := e.acct.Close(); err != nil {
		t.Fatal(err)
	}
	e.acct = e.attach(t, pinDir)
	if err := e.acct.AddPod(e.pod.IP, 1); err != nil {
		t.Fatal(err)
	}
	upgraded := time.Now()
	got := e.waitCounters(t, "build B counts the open connections", func(c PodCounters) bool {
		return c.ConnsInFlight == clients && c.Requests.Completed > 100
	})
	t.Logf("build B: %d connections, %d requests %v after the upgrade", got.ConnsInFlight, got.Requests.Completed, time.Since(upgraded).Round(time.Millisecond))
	time.Sleep(300 * time.Millisecond)
	res := load.Stop()
	if res.Failed > 0 {
		t.Errorf("%d requests failed", res.Failed)
	}
	got = e.waitCounters(t, "the load done", func(c PodCounters) bool { return c.Requests.InFlight == 0 })
	if got.Requests.Started != got.Requests.Completed || got.ConnsTotal != clients || got.OpaqueConnsTotal != 0 {
		t.Errorf("after the load: started=%d completed=%d conns total=%d opaque=%d, want started = completed, %d connections, none opaque",
			got.Requests.Started, got.Requests.Completed, got.ConnsTotal, got.OpaqueConnsTotal, clients)
	}
	ev, err := e.acct.Events()
	if err != nil {
		t.Fatal(err)
	}
	if ev.Adopted != clients {
		t.Errorf("events: %+v, want %d adopted", ev, clients)
	}
	client.CloseIdleConnections()
	e.waitCounters(t, "the connections closed", func(c PodCounters) bool { return c.ConnsInFlight == 0 })
}

// TestKernelAdoptsConnectionsOpenBeforeLoad opens keep-alive connections
// before any accounting is attached (no sock_ops program saw them, so
// none asked for their state changes), then attaches it: their requests
// count exactly from the next one, they count as connections, and their
// close is seen (at the server's FIN) so the count goes back to 0.
func TestKernelAdoptsConnectionsOpenBeforeLoad(t *testing.T) {
	inFamilies(t, testAdoptsConnectionsOpenBeforeLoad)
}

func testAdoptsConnectionsOpenBeforeLoad(t *testing.T, ipv6 bool) {
	e := newFamilyEnv(t, "", ipv6)
	if err := e.acct.Close(); err != nil { // unpinned: the programs detach
		t.Fatal(err)
	}
	const clients = 4
	client := loadgen.NewClient(clients, true)
	defer client.CloseIdleConnections()
	before := loadgen.Run(loadgen.Options{URLs: []string{e.url("size=10")}, Concurrency: clients, KeepAlive: true, Client: client}, 200*time.Millisecond)
	if before.Completed == 0 || before.Failed > 0 {
		t.Fatalf("before the accounting: %d completed, %d failed", before.Completed, before.Failed)
	}

	e.acct = e.attach(t, "")
	if err := e.acct.AddPod(e.pod.IP, 1); err != nil {
		t.Fatal(err)
	}
	// The same connections, idle meanwhile: each one's next segment is a
	// whole request line, so every request counts.
	res := loadgen.Run(loadgen.Options{URLs: []string{e.url("sleep=1ms")}, Concurrency: clients, KeepAlive: true, Client: client}, 500*time.Millisecond)
	if res.Failed > 0 {
		t.Errorf("%d requests failed", res.Failed)
	}
	got := e.waitCounters(t, "the requests counted", func(c PodCounters) bool { return int64(c.Requests.Completed) == res.Completed })
	if int64(got.Requests.Started) != res.Completed || got.Requests.InFlight != 0 || got.ConnsInFlight != clients || got.ConnsTotal != clients {
		t.Errorf("adopted: started=%d in flight=%d conns=%d (total %d), want %d, 0, %d, %d",
			got.Requests.Started, got.Requests.InFlight, got.ConnsInFlight, got.ConnsTotal, res.Completed, clients, clients)
	}
	client.CloseIdleConnections()
	e.waitCounters(t, "the adopted connections closed", func(c PodCounters) bool { return c.ConnsInFlight == 0 })
	// A new connection is the accept's, not adopted.
	c2 := loadgen.Run(loadgen.Options{URLs: []string{e.url("size=1")}, Concurrency: 1, KeepAlive: false}, 100*time.Millisecond)
	got = e.waitCounters(t, "a new connection counted", func(c PodCounters) bool {
		return c.ConnsInFlight == 0 && int64(c.Requests.Completed) == res.Completed+c2.Completed
	})
	if want := uint64(clients) + uint64(c2.Completed); got.ConnsTotal != want {
		t.Errorf("conns total = %d, want %d", got.ConnsTotal, want)
	}
	ev, err := e.acct.Events()
	if err != nil {
		t.Fatal(err)
	}
	if ev.Adopted != clients {
		t.Errorf("events: %+v, want %d adopted", ev, clients)
	}
}

// podClientEnv, when set to a URL, makes the test binary a pod's client:
// released on stdin (into the pod's cgroup), it sends podClientRequests
// GETs to the URL on one keep-alive connection and exits (0: all 200).
const podClientEnv = "SOCKSCALE_BPF_POD_CLIENT"

const podClientRequests = 20

func podClientMain() {
	url := os.Getenv(podClientEnv)
	if url == "" {
		return
	}
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // released into the cgroup
	client := loadgen.NewClient(1, true)
	for range podClientRequests {
		resp, err := client.Get(url)
		if err != nil {
			fmt.Fprintln(os.Stderr, "pod client:", err)
			os.Exit(1)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			fmt.Fprintln(os.Stderr, "pod client:", resp.Status)
			os.Exit(1)
		}
	}
	os.Exit(0)
}

// TestKernelPodClientConnectionsAreNotAdopted has a pod call a server
// outside it: its client connection has the pod's address too, and no
// state (sock_ops follows accepted connections only), but nothing listens
// on its local port, so ingress must not adopt it as a server connection.
func TestKernelPodClientConnectionsAreNotAdopted(t *testing.T) {
	e := newKernelEnv(t, "")
	base := e.waitCounters(t, "readiness dial closed", func(c PodCounters) bool { return c.ConnsInFlight == 0 })
	// The server is in the host's network namespace and the test's own
	// cgroup, below no attach point.
	l, err := net.Listen("tcp", netip.AddrPortFrom(e.pod.HostIP, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: testpod.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", e.pod.Name, self)
	cmd.Env = append(os.Environ(), podClientEnv+"=http://"+l.Addr().String()+"/?size=100")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	gate, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// ip netns exec execs the binary in place: this pid is the client.
	if err := os.WriteFile(filepath.Join(e.pod.Cgroup, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(gate, "go\n"); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("pod client: %v", err)
	}
	got, _ := e.counters(t)
	if got != base {
		t.Errorf("after the pod's %d requests to a server outside it, its counters went from %+v to %+v, want unchanged", podClientRequests, base, got)
	}
	ev, err := e.acct.Events()
	if err != nil {
		t.Fatal(err)
	}
	if ev.Adopted != 0 {
		t.Errorf("events: %+v, want nothing adopted", ev)
	}
}
