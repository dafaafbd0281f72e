//go:build linux

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sockscale/sockscale/bpf"
	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationSocketRedirectFlag runs the agent in-process against a
// real kube-apiserver: with --socket-redirect=auto it attaches and pins the
// redirect beside the accounting; a later agent with off removes the
// redirect's pins (nobody would keep its entries current) and keeps the
// accounting's.
func TestIntegrationSocketRedirectFlag(t *testing.T) {
	testenv.RequireRoot(t)
	cl := testenv.ControlPlane(t)
	if err := testenv.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	cg2, err := cgroup2.Root()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(cg2, fmt.Sprintf("sockscale-agent-flag-it-%d", os.Getpid()))
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(root) })
	pinDir := fmt.Sprintf("/sys/fs/bpf/sockscale-agent-flag-it-%d", os.Getpid())
	t.Cleanup(func() { _ = bpf.Uninstall(pinDir) })

	runFor := func(mode string) (redirectPins, otherPins int) {
		t.Helper()
		cfg, err := parseFlags([]string{
			"--node-name=node-a", "--cgroup-root=" + root, "--bpffs-dir=" + pinDir, "--kubeconfig=" + cl.Kubeconfig,
			"--metrics-bind-address=127.0.0.1:0", "--health-probe-bind-address=127.0.0.1:0", "--socket-redirect=" + mode,
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
