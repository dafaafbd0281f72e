//go:build !linux

package drain

import (
	"errors"
	"net"
)

// ListenIn listens on addr; another namespace needs Linux.
func ListenIn(nsPath, addr string) (net.Listener, error) {
	if nsPath == "" {
		return net.Listen("tcp", addr)
	}
	return nil, errors.New("listening in another network namespace needs Linux")
}
