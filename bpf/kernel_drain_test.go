package bpf

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// serverConnFDs duplicates (pidfd_getfd) the file descriptors of the
// connections process pid accepted: sockets with a peer that are no
// listener. The caller closes them.
func serverConnFDs(t *testing.T, pid int) []int {
	t.Helper()
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var fds []int
	for _, e := range ents {
		target, _ := os.Readlink(filepath.Join(dir, e.Name()))
		if !strings.HasPrefix(target, "socket:") {
			continue
		}
		num, _ := strconv.Atoi(e.Name())
		fd, err := unix.PidfdGetfd(pidfd, num, 0)
		if err != nil {
			continue // closed meanwhile
		}
		if typ, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); typ != unix.SOCK_STREAM {
			unix.Close(fd)
			continue
		}
		if listening, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); listening != 0 {
			unix.Close(fd)
			continue
		}
		if _, err := unix.Getpeername(fd); err != nil {
			unix.Close(fd)
			continue
		}
		fds = append(fds, fd)
	}
	return fds
}

// TestKernelDrainAsksClientsToClose: connections of a pod that is leaving,
// handed to the drain program between two responses, carry
// "Connection: close" on their next response only; the clients close them
// and go on on new connections, and no request fails.
func TestKernelDrainAsksClientsToClose(t *testing.T) {
	e := newKernelEnv(t, "")
	const clients = 4
	var (
		stop              atomic.Bool
		ok, closes, newCo atomic.Int64
		mu                sync.Mutex
		errs              []error
		wg                sync.WaitGroup
	)
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		if !i.Reused {
			newCo.Add(1)
		}
	}}
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}, Timeout: 10 * time.Second}
			defer c.CloseIdleConnections()
			for !stop.Load() {
				req, _ := http.NewRequest(http.MethodGet, e.url("sleep=20ms"), nil)
				resp, err := c.Do(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					continue
				}
				ok.Add(1)
				if resp.Close {
					closes.Add(1)
				}
			}
		}()
	}
	defer func() { stop.Store(true); wg.Wait() }()
	e.waitCounters(t, "the clients' connections", func(c PodCounters) bool { return c.ConnsInFlight == clients })

	// The kernel counts a connection once established; the server holds
	// its fd only once it accepted it: wait for that too.
	var fds []int
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		fds = serverConnFDs(t, e.pod.PIDs()[0])
		if len(fds) == clients || time.Now().After(deadline) {
			break
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	if len(fds) != clients {
		t.Fatalf("%d server connections, want %d", len(fds), clients)
	}
	drained := 0
	deadline := time.Now().Add(5 * time.Second)
	for len(fds) > 0 && time.Now().Before(deadline) {
		rest := fds[:0]
		for _, fd := range fds {
			act, err := e.acct.ConnActivity(fd)
			if err != nil {
				t.Fatal(err)
			}
			unsent, err := unix.IoctlGetInt(fd, unix.SIOCOUTQNSD)
			if err != nil {
				t.Fatal(err)
			}
			if (act != ConnIdle && act != ConnWaiting) || unsent != 0 {
				rest = append(rest, fd)
				continue
			}
			if err := e.acct.Drain(fd); err != nil {
				t.Fatal(err)
			}
			drained++
			unix.Close(fd)
		}
		fds = rest
		time.Sleep(time.Millisecond)
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	if drained != clients {
		t.Fatalf("handed %d of %d connections to the drain program in 5 s", drained, clients)
	}
	newBefore := newCo.Load()
	okBefore := ok.Load()
	time.Sleep(500 * time.Millisecond)
	stop.Store(true)
	wg.Wait()
	if got := closes.Load(); got != clients {
		t.Errorf("%d responses asked the client to close, want %d (one per drained connection)", got, clients)
	}
	if got := newCo.Load() - newBefore; got != clients {
		t.Errorf("the clients opened %d new connections after the drain, want %d", got, clients)
	}
	if len(errs) > 0 {
		t.Errorf("%d requests failed, e.g. %v", len(errs), errors.Join(errs[:min(3, len(errs))]...))
	}
	// The added header is one more line for the response parser: every
	// request still ends with its response.
	done := e.waitCounters(t, "every request completed", func(c PodCounters) bool { return c.Requests.Completed == uint64(ok.Load()) })
	if done.Requests.InFlight != 0 || done.Requests.Started != uint64(ok.Load()) {
		t.Errorf("after the clients stopped: %d in flight, %d started, want 0 and %d", done.Requests.InFlight, done.Requests.Started, ok.Load())
	}
	t.Logf("%d requests answered after the drain; %d before", ok.Load()-okBefore, okBefore)
}
