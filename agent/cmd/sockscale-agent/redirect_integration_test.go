//go:build linux

package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sockscale/sockscale/bpf"
	"github.com/sockscale/sockscale/bpf/redirect"
	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
	"github.com/sockscale/sockscale/internal/testutil/statssink"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationSocketRedirectFlag runs the agent in-process against a
// real kube-apiserver: with --socket-redirect=auto it attaches and pins the
// redirect beside the accounting; a later agent with off removes the
// redirect's pins (nobody would keep its entries current) and keeps the
// accounting's.
func TestIntegrationSocketRedirectFlag(t *testing.T) {
	cl, root, pinDir := agentEnv(t, "flag")

	runFor := func(mode string) (redirectPins, otherPins int) {
		t.Helper()
		cfg, err := parseFlags([]string{
			"--node-name=node-a", "--cgroup-root=" + root, "--bpffs-dir=" + pinDir, "--kubeconfig=" + cl.Kubeconfig, "--activator-namespace=default",
			"--metrics-bind-address=127.0.0.1:0", "--metrics-secure=false", "--health-probe-bind-address=127.0.0.1:0", "--socket-redirect=" + mode,
		})
		if err != nil {
			t.Fatal(err)
		}
		// Long enough for the redirect's first resync (it logs it).
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		if err := run(ctx, cfg, slog.New(slog.NewTextHandler(os.Stderr, nil))); err != nil {
			t.Fatalf("--socket-redirect=%s: run: %v", mode, err)
		}
		entries, err := os.ReadDir(pinDir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "redirect") {
				redirectPins++
			} else {
				otherPins++
			}
		}
		return redirectPins, otherPins
	}
	// 4 links (connect4/6, getpeername4/6) and the maps' directory.
	if r, o := runFor("auto"); r != 5 || o == 0 {
		t.Errorf("after --socket-redirect=auto: %d redirect pins, %d others; want 5 and the accounting's", r, o)
	}
	if r, o := runFor("off"); r != 0 || o == 0 {
		t.Errorf("after --socket-redirect=off: %d redirect pins, %d others; want none and the accounting's", r, o)
	}
}

// TestIntegrationSocketRedirectAutoWithoutTheCRD runs the agent with
// --socket-redirect=auto against an API server without the
// ServerlessService CRD: it keeps running (the accounting is its main
// job), says unavailable with a reason naming the missing kind beside its
// batches, clears the stale entry an earlier agent left in the pinned map,
// and turns active without a restart once the CRD is installed.
func TestIntegrationSocketRedirectAutoWithoutTheCRD(t *testing.T) {
	const serverlessServices = "serverlessservices.sockscale.dev"
	cl, root, pinDir := agentEnv(t, "nocrd", testenv.WithoutCRD(serverlessServices))

	ctx := context.Background()

	// An entry an earlier agent left: with nobody to keep it current it
	// must go.
	stale := netip.MustParseAddrPort("10.96.0.10:80")
	pinned, err := redirect.New(redirect.Options{CgroupRoot: root, PinDir: pinDir})
	if err != nil {
		t.Fatal(err)
	}
	if err := pinned.Set(stale, []redirect.Backend{{Addr: netip.MustParseAddrPort("10.0.0.9:8012"), Weight: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := pinned.Close(); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var last *stats.NodeState
	srv := httptest.NewServer(statssink.Handler(func(b *stats.Batch) {
		mu.Lock()
		defer mu.Unlock()
		last = b.NodeState
	}))
	t.Cleanup(srv.Close)
	lastState := func() *stats.NodeState {
		mu.Lock()
		defer mu.Unlock()
		return last
	}

	cfg, err := parseFlags([]string{
		"--node-name=node-a", "--cgroup-root=" + root, "--bpffs-dir=" + pinDir, "--kubeconfig=" + cl.Kubeconfig, "--activator-namespace=default",
		"--metrics-bind-address=127.0.0.1:0", "--metrics-secure=false", "--health-probe-bind-address=127.0.0.1:0", "--socket-redirect=auto",
		"--controller-stats-address=" + srv.Listener.Addr().String(), "--report-period=100ms",
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg.redirectRetryBackoff = 200 * time.Millisecond // the default 5 s doubling would outlast the test
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx, cfg, slog.New(slog.NewTextHandler(os.Stderr, nil))) }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			stop()
			<-done
		}
	})

	waitFor(t, 20*time.Second, "a batch saying unavailable because ServerlessServices are missing", func() string {
		s := lastState()
		if s == nil {
			return "no batch with a node state yet"
		}
		if s.SocketRedirect != stats.RedirectUnavailable || !strings.Contains(s.Reason, "ServerlessService") {
			return fmt.Sprintf("last state %+v", *s)
		}
		return ""
	})
	t.Logf("state without the CRD: %+v", *lastState())
	select {
	case err := <-done:
		stopped = true
		t.Fatalf("the agent returned while the CRD is missing: %v", err)
	default:
	}
	pinned, err = redirect.New(redirect.Options{CgroupRoot: root, PinDir: pinDir})
	if err != nil {
		t.Fatal(err)
	}
	entries, err := pinned.Entries()
	_ = pinned.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("pinned map holds %v; want it cleared (a stale entry redirects to activators that may be gone)", entries)
	}

	// The CRD installed later: a retry finds it, no restart needed.
	cl.InstallCRD(t, serverlessServices)
	waitFor(t, 30*time.Second, "a batch saying active once the CRD is installed", func() string {
		if s := lastState(); s == nil || s.SocketRedirect != stats.RedirectActive || s.Reason != "" {
			return fmt.Sprintf("last state %+v", s)
		}
		return ""
	})

	stop()
	stopped = true
	if err := <-done; err != nil {
		t.Errorf("run: %v, want nil once ctx ends", err)
	}
}

// waitFor polls check until it returns "" and fails t with its last
// answer after timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, check func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msg := check()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting %v for %s: %s", timeout, what, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// agentEnv is what an in-process agent needs: a real kube-apiserver, a
// cgroup of its own to attach at and a bpffs directory to pin into (both
// named after name and removed at the end).
func agentEnv(t *testing.T, name string, opts ...testenv.Option) (cl *testenv.Cluster, root, pinDir string) {
	t.Helper()
	testenv.RequireRoot(t)
	cl = testenv.ControlPlane(t, opts...)
	if err := testenv.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	cg2, err := cgroup2.Root()
	if err != nil {
		t.Fatal(err)
	}
	root = filepath.Join(cg2, fmt.Sprintf("sockscale-agent-%s-it-%d", name, os.Getpid()))
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(root) })
	pinDir = fmt.Sprintf("/sys/fs/bpf/sockscale-agent-%s-it-%d", name, os.Getpid())
	t.Cleanup(func() { _ = bpf.Uninstall(pinDir) })
	return cl, root, pinDir
}
