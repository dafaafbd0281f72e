package bpf

import (
	"fmt"

	"github.com/sockscale/sockscale/bpf/redirect"
)

// UninstallAll detaches every program the agent attaches (the accounting's
// and the connect-time redirect's) and removes every pin under pinDir and
// pinDir itself: what an uninstall leaves of the agent in the kernel is
// nothing. A missing directory is not an error.
func UninstallAll(pinDir string) error {
	// The redirect first: it leaves the directory when the accounting's
	// pins are still in it; the accounting's Uninstall removes the rest.
	if err := redirect.Uninstall(pinDir); err != nil {
		return fmt.Errorf("uninstall socket-layer redirect: %w", err)
	}
	if err := Uninstall(pinDir); err != nil {
		return fmt.Errorf("uninstall accounting: %w", err)
	}
	return nil
}
