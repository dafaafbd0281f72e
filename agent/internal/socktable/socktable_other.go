//go:build !linux

package socktable

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"

	"github.com/vishvananda/netns"
)

// errUnsupported: network namespaces and sock_diag are Linux's.
var errUnsupported = fmt.Errorf("socktable on %s: %w", runtime.GOOS, errors.ErrUnsupported)

// Find is implemented on Linux only.
func (f Finder) Find(want []netip.Addr) (map[netip.Addr]Namespace, error) {
	return nil, errUnsupported
}

// Open is implemented on Linux only.
func (n Namespace) Open() (netns.NsHandle, error) {
	return netns.None(), errUnsupported
}

// Addrs is implemented on Linux only.
func (n Namespace) Addrs() ([]netip.Addr, error) {
	return nil, errUnsupported
}

// Dump is implemented on Linux only.
func Dump(ns Namespace, storageMapFDs []int) ([]Socket, error) {
	return nil, errUnsupported
}

// DumpServerSide is implemented on Linux only.
func DumpServerSide(ns Namespace, storageMapFDs []int) ([]Socket, error) {
	return nil, errUnsupported
}
