//go:build linux

package drain

import (
	"context"
	"errors"
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
	"github.com/sockscale/sockscale/internal/testutil/testenv"
	"github.com/sockscale/sockscale/internal/testutil/testpod"
)

func TestMain(m *testing.M) {
	testpod.Main() // returns unless this process is a test pod's server
	os.Exit(m.Run())
}

var nextSubnet atomic.Uint32

// TestKernelDrainFinishesRequestsAndMovesClients: a pod leaves while
// keep-alive clients load it and one slow request is in flight. New
// connections go to another pod from then on, as kube-proxy's would once
// the endpoint is gone; the kept-alive ones are moved by the drain. The
// preStop's wait returns once the slow request is answered and no
// connection is left, and then the pod's server is killed, as an app that
// exits on SIGTERM would be: not one request fails.
func TestKernelDrainFinishesRequestsAndMovesClients(t *testing.T) {
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
	var pods [2]*testpod.Pod
	for i := range pods {
		pods[i] = testpod.New(t, testpod.Options{Subnet: uint8(60 + nextSubnet.Add(1)%20), CgroupParent: root})
		if err := pods[i].Start(testpod.RoleHTTP, testpod.HTTPPort); err != nil {
			t.Fatal(err)
		}
	}
	acct, err := bpf.New(bpf.Options{CgroupRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = acct.Close() })
	for i, p := range pods {
		if err := acct.AddPod(p.IP, uint64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	leaving, served := pods[0], pods[1]

	// "The Service": pod 0 until it leaves, then pod 1.
	var gone atomic.Bool
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		p := leaving
		if gone.Load() {
			p = served
		}
		var d net.Dialer
		return d.DialContext(ctx, network, p.Addr(testpod.HTTPPort))
	}
	var (
		stop   atomic.Bool
		ok     atomic.Int64
		mu     sync.Mutex
		failed []error
		wg     sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		failed = append(failed, err)
		mu.Unlock()
	}
	get := func(c *http.Client, query string) {
		resp, err := c.Get("http://service/?" + query)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		if err != nil {
			fail(err)
			return
		}
		ok.Add(1)
	}
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Transport: &http.Transport{DialContext: dial, MaxIdleConnsPerHost: 1}, Timeout: 10 * time.Second}
			defer c.CloseIdleConnections()
			for !stop.Load() {
				get(c, "sleep=20ms")
			}
		}()
	}
	defer func() { stop.Store(true); wg.Wait() }()
	time.Sleep(300 * time.Millisecond)
	// One slow request, on a connection of its own that then stays idle.
	slow := &http.Client{Transport: &http.Transport{DialContext: dial}, Timeout: 10 * time.Second}
	slowDone := make(chan struct{})
	go func() { defer close(slowDone); get(slow, "sleep=1500ms") }()
	time.Sleep(100 * time.Millisecond)

	pl := &fakePods{}
	d := New(acct, pl, Sockets{}, Options{MinWait: 500 * time.Millisecond, IdleClose: 300 * time.Millisecond, Poll: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go d.Run(ctx)
	start := time.Now()
	pl.set(podwatch.Leaving{Pod: podwatch.Pod{Namespace: "ns", Name: "app-1", Workload: "app", UID: "uid-1"}, IPs: []netip.Addr{leaving.IP}, Since: start})
	gone.Store(true)

	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	r := d.Wait(wctx, "ns", "app", time.Second)
	took := time.Since(start)
	<-slowDone
	t.Logf("drained in %v: %+v", took.Round(time.Millisecond), r)
	if r.Pods != 1 || r.Drained != 1 {
		t.Fatalf("wait for the leaving pod: %+v after %v, want it drained", r, took)
	}
	if took < 1300*time.Millisecond {
		t.Errorf("drained after %v, before the slow request (1.5 s) was answered", took)
	}
	// What SIGTERM does to an app that exits at once.
	if err := leaving.Delete(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if len(failed) > 0 {
		t.Errorf("%d of %d requests failed, e.g. %v", len(failed), int(ok.Load())+len(failed), errors.Join(failed[:min(3, len(failed))]...))
	}
	s, err := acct.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Pods[served.IP].Requests.Completed; got == 0 {
		t.Errorf("the other pod served nothing: the clients never moved")
	}
}

// TestKernelListenInAnotherNamespace: the listener is made in the named
// namespace: it binds an address only that namespace has, and clients
// reach it there.
func TestKernelListenInAnotherNamespace(t *testing.T) {
	testenv.RequireRoot(t)
	p := testpod.New(t, testpod.Options{Subnet: uint8(60 + nextSubnet.Add(1)%20)})
	addr := net.JoinHostPort(p.IP.String(), "9094")
	if l, err := net.Listen("tcp", addr); err == nil {
		l.Close()
		t.Fatalf("%s can be bound in the test's own namespace: the test proves nothing", addr)
	}
	l, err := ListenIn("/run/netns/"+p.Name, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			_, _ = io.WriteString(c, "hello")
			c.Close()
		}
	}()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if b, err := io.ReadAll(c); err != nil || string(b) != "hello" {
		t.Errorf("read %q, %v from the listener in %s", b, err, p.Name)
	}
}
