package redirect

import (
	"fmt"
	"log/slog"

	bpfredirect "github.com/sockscale/sockscale/bpf/redirect"
	"github.com/sockscale/sockscale/internal/stats"
)

// Mode is the agent's --socket-redirect: whether it loads the kernel's
// connect-time redirect.
type Mode string

// Values of Mode.
const (
	// ModeAuto loads the redirect where the kernel can, and runs without
	// it where it cannot.
	ModeAuto Mode = "auto"
	// ModeOn loads it or fails.
	ModeOn Mode = "on"
	// ModeOff never loads it: Proxy mode takes kube-proxy's path only.
	ModeOff Mode = "off"
)

// LoadOptions say how and where LoadKernelRedirect loads the redirect.
type LoadOptions struct {
	Mode Mode
	// HaveActivators: the activator selector is set. Without it the
	// redirect has no destinations, and auto turns it off.
	HaveActivators bool
	// CgroupRoot and PinDir are the accounting's: the redirect attaches
	// and pins beside it.
	CgroupRoot, PinDir string
	Log                *slog.Logger
}

// LoadKernelRedirect loads the connect-time redirect as opts.Mode says,
// or returns nil with the node state that says why it is not loaded:
//
//   - off never loads it;
//   - auto without activators does not either; auto on a kernel that
//     refuses the programs logs the kernel's reason and runs without it;
//   - on fails where the kernel refuses.
//
// Whenever it is not loaded, a redirect an earlier agent pinned is
// removed: nobody would keep its entries up to date.
func LoadKernelRedirect(opts LoadOptions) (*bpfredirect.Redirect, stats.NodeState, error) {
	return loadKernelRedirect(opts, bpfredirect.New, bpfredirect.Uninstall)
}

// loadKernelRedirect is LoadKernelRedirect with bpf/redirect's New and
// Uninstall passed in (tests fake the kernel).
func loadKernelRedirect(opts LoadOptions, load func(bpfredirect.Options) (*bpfredirect.Redirect, error), uninstall func(pinDir string) error) (*bpfredirect.Redirect, stats.NodeState, error) {
	mode := opts.Mode
	off := stats.NodeState{SocketRedirect: stats.RedirectOff, Reason: "--socket-redirect=off"}
	if mode == ModeAuto && !opts.HaveActivators {
		opts.Log.Warn("socket-layer redirect off: --activator-selector is empty, so the activators cannot be found")
		mode = ModeOff
		off.Reason = "--activator-selector is empty: the activators cannot be found"
	}
	if mode != ModeOff {
		r, err := load(bpfredirect.Options{CgroupRoot: opts.CgroupRoot, PinDir: opts.PinDir, Lease: LeaseTTL})
		if err == nil {
			return r, stats.NodeState{}, nil
		}
		if mode == ModeOn {
			return nil, stats.NodeState{}, fmt.Errorf("--socket-redirect=on: %w", err)
		}
		opts.Log.Warn("socket-layer redirect off: this kernel cannot load it; Proxy mode goes through the public EndpointSlices (kube-proxy) only. --socket-redirect=on makes this fatal", "err", err)
		off = stats.NodeState{SocketRedirect: stats.RedirectUnavailable, Reason: err.Error()}
	}
	if err := uninstall(opts.PinDir); err != nil {
		return nil, stats.NodeState{}, fmt.Errorf("remove the pinned socket-layer redirect (--socket-redirect=%s): %w", opts.Mode, err)
	}
	return nil, off, nil
}
