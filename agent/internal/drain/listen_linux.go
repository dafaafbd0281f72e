package drain

import (
	"fmt"
	"net"
	"runtime"

	"golang.org/x/sys/unix"
)

// ListenIn listens on addr (TCP) in the network namespace at nsPath (empty:
// the agent's own): the preStop hooks' wait is served on the node's
// loopback, where the kubelet makes its requests, while the agent's pod
// has a network of its own. A socket stays in the namespace it was made
// in, so only its creation runs there, on a locked thread of its own
// goroutine.
func ListenIn(nsPath, addr string) (net.Listener, error) {
	if nsPath == "" {
		return net.Listen("tcp", addr)
	}
	type result struct {
		l   net.Listener
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		l, back, err := listenLocked(nsPath, addr)
		done <- result{l, err}
		// A thread left in the other namespace must not run another
		// goroutine: one that exits locked takes its thread along.
		if back {
			runtime.UnlockOSThread()
		}
	}()
	r := <-done
	return r.l, r.err
}

// listenLocked does ListenIn's work on a locked thread; back tells whether
// the thread is in its own namespace again.
func listenLocked(nsPath, addr string) (l net.Listener, back bool, err error) {
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, true, fmt.Errorf("listen on %s in %s: open our own network namespace: %w", addr, nsPath, err)
	}
	defer closeFD(orig)
	target, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, true, fmt.Errorf("listen on %s in %s: %w", addr, nsPath, err)
	}
	defer closeFD(target)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		return nil, true, fmt.Errorf("listen on %s in %s: enter the namespace: %w", addr, nsPath, err)
	}
	l, lerr := net.Listen("tcp", addr)
	if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
		if lerr == nil {
			_ = l.Close()
		}
		return nil, false, fmt.Errorf("listen on %s in %s: return to our own namespace: %w", addr, nsPath, err)
	}
	if lerr != nil {
		return nil, true, fmt.Errorf("listen on %s in %s: %w", addr, nsPath, lerr)
	}
	return l, true, nil
}
