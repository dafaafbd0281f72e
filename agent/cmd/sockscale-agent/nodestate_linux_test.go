//go:build linux

package main

import (
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	agentredirect "github.com/sockscale/sockscale/agent/internal/redirect"
	"github.com/sockscale/sockscale/internal/stats"
)

// TestRedirectOffSaysWhy: when the redirect is not loaded, the state sent
// beside the batches names the flag that turned it off. (The kernel's load
// error, the other reason, needs a kernel that fails to load it.)
func TestRedirectOffSaysWhy(t *testing.T) {
	tests := []struct {
		args []string
		want stats.NodeState
	}{
		{[]string{"--socket-redirect=off"}, stats.NodeState{SocketRedirect: stats.RedirectOff, Reason: "--socket-redirect=off"}},
		{[]string{"--socket-redirect=auto", "--activator-selector="},
			stats.NodeState{SocketRedirect: stats.RedirectOff, Reason: "--activator-selector is empty: the activators cannot be found"}},
	}
	for _, tt := range tests {
		// No pins there: nothing to remove, so no root needed.
		pinDir := filepath.Join(t.TempDir(), "pins")
		cfg, err := parseFlags(append([]string{"--node-name=n", "--bpffs-dir=" + pinDir, "--activator-namespace=sockscale-system"}, tt.args...))
		if err != nil {
			t.Fatal(err)
		}
		r, got, err := agentredirect.LoadKernelRedirect(cfg.redirectLoadOptions(slog.New(slog.NewTextHandler(io.Discard, nil))))
		if err != nil || r != nil {
			t.Fatalf("%v: LoadKernelRedirect = %v, %v; want no redirect and no error", tt.args, r, err)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%v: state (-want +got):\n%s", tt.args, diff)
		}
	}
}
