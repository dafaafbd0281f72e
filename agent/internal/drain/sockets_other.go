//go:build !linux

package drain

import (
	"errors"
	"net/netip"

	"github.com/sockscale/sockscale/agent/internal/socktable"
)

// Sockets finds a pod's server connections (Linux only).
type Sockets struct {
	Finder socktable.Finder
}

var errUnsupported = errors.New("drains need Linux")

// ServerConns fails off Linux.
func (s Sockets) ServerConns(netip.Addr) ([]int, error) { return nil, errUnsupported }

func cookieOf(int) (uint64, error) { return 0, errUnsupported }
func unsentBytes(int) (int, error) { return 0, errUnsupported }
func closeWrite(int) error         { return errUnsupported }
func closeFD(int)                  {}
