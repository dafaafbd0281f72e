package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// Buffered: a signal that arrives while the loop reaps is not lost.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	reap := os.Getpid() == 1
	for sig := range sigs {
		if sig == syscall.SIGCHLD {
			if reap {
				reapAll()
			}
			continue
		}
		fmt.Fprintf(os.Stderr, "pause: %v, exiting\n", sig)
		return
	}
}

// reapAll collects every child that has ended; SIGCHLDs coalesce, so one
// signal may stand for several.
func reapAll() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
