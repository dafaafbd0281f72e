package redirect

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	bpfredirect "github.com/sockscale/sockscale/bpf/redirect"
	"github.com/sockscale/sockscale/internal/stats"
)

// fakeKernel stands for bpf/redirect's New and Uninstall.
type fakeKernel struct {
	refuse      error // New's error; nil loads
	loads       int
	uninstalled []string
}

func (k *fakeKernel) load(o bpfredirect.Options) (*bpfredirect.Redirect, error) {
	k.loads++
	if k.refuse != nil {
		return nil, k.refuse
	}
	return &bpfredirect.Redirect{}, nil
}

func (k *fakeKernel) uninstall(pinDir string) error {
	k.uninstalled = append(k.uninstalled, pinDir)
	return nil
}

// TestLoadKernelRedirectModes is the --socket-redirect policy: off never
// loads; auto loads where the kernel can and otherwise says why, in the
// log and the node state; on fails where the kernel refuses. Whenever
// nothing is loaded, an earlier agent's pins are removed.
func TestLoadKernelRedirectModes(t *testing.T) {
	refused := errors.New("program connect4: operation not permitted")
	tests := []struct {
		name           string
		mode           Mode
		noActivators   bool
		refuse         error
		wantLoaded     bool
		wantErr        string
		wantState      stats.NodeState
		wantLoads      int
		wantUninstall  bool
		wantLogContain string
	}{
		{name: "off", mode: ModeOff, wantState: stats.NodeState{SocketRedirect: stats.RedirectOff, Reason: "--socket-redirect=off"}, wantUninstall: true},
		{name: "off on a refusing kernel", mode: ModeOff, refuse: refused,
			wantState: stats.NodeState{SocketRedirect: stats.RedirectOff, Reason: "--socket-redirect=off"}, wantUninstall: true},
		{name: "auto loads", mode: ModeAuto, wantLoaded: true, wantLoads: 1},
		{name: "auto without activators", mode: ModeAuto, noActivators: true,
			wantState:     stats.NodeState{SocketRedirect: stats.RedirectOff, Reason: "--activator-selector is empty: the activators cannot be found"},
			wantUninstall: true, wantLogContain: "--activator-selector is empty"},
		{name: "auto falls back", mode: ModeAuto, refuse: refused, wantLoads: 1,
			wantState:     stats.NodeState{SocketRedirect: stats.RedirectUnavailable, Reason: refused.Error()},
			wantUninstall: true, wantLogContain: "this kernel cannot load it"},
		{name: "on loads", mode: ModeOn, wantLoaded: true, wantLoads: 1},
		{name: "on fails", mode: ModeOn, refuse: refused, wantLoads: 1, wantErr: "--socket-redirect=on: " + refused.Error()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := &fakeKernel{refuse: tt.refuse}
			var logs bytes.Buffer
			r, state, err := loadKernelRedirect(LoadOptions{Mode: tt.mode, HaveActivators: !tt.noActivators, CgroupRoot: "/cg", PinDir: "/pins",
				Log: slog.New(slog.NewTextHandler(&logs, nil))}, k.load, k.uninstall)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if (r != nil) != tt.wantLoaded {
				t.Errorf("loaded = %v, want %v", r != nil, tt.wantLoaded)
			}
			if k.loads != tt.wantLoads {
				t.Errorf("%d loads, want %d", k.loads, tt.wantLoads)
			}
			if diff := cmp.Diff(tt.wantState, state); diff != "" {
				t.Errorf("state (-want +got):\n%s", diff)
			}
			if got := len(k.uninstalled) > 0; got != tt.wantUninstall {
				t.Errorf("pins removed = %v (%v), want %v", got, k.uninstalled, tt.wantUninstall)
			}
			if tt.wantLogContain != "" && !strings.Contains(logs.String(), tt.wantLogContain) {
				t.Errorf("log %q does not say %q", logs.String(), tt.wantLogContain)
			}
		})
	}
}
