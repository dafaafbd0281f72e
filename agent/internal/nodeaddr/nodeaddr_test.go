package nodeaddr

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

// TestLoopSetsTheNodesAddressesOnChange drives the loop with a fake read:
// the set is handed over sorted, without loopback, link-local or
// duplicates, once at the start and again only when it changed; a failed
// read or set is retried at the next event.
func TestLoopSetsTheNodesAddressesOnChange(t *testing.T) {
	var mu sync.Mutex
	current := addrs("10.0.0.2", "127.0.0.1", "192.168.1.5", "10.0.0.2", "169.254.1.1")
	var readErr, setErr error
	var sets [][]netip.Addr
	var errs int
	reads := make(chan struct{}, 10)
	read := func() ([]netip.Addr, error) {
		mu.Lock()
		defer func() { mu.Unlock(); reads <- struct{}{} }()
		return append([]netip.Addr(nil), current...), readErr
	}
	o := Options{
		Set: func(a []netip.Addr) error {
			mu.Lock()
			defer mu.Unlock()
			if setErr != nil {
				return setErr
			}
			sets = append(sets, a)
			return nil
		},
		Settle:  time.Millisecond,
		Resync:  time.Hour,
		OnError: func(error) { mu.Lock(); errs++; mu.Unlock() },
	}
	events := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { loop(ctx, o, events, read); close(done) }()
	// An event, and wait for the read it brings (whose set follows it in
	// the same goroutine, before the next event is taken).
	event := func() { events <- struct{}{}; <-reads }
	<-reads // the first read
	waitSets := func(n int) [][]netip.Addr {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			mu.Lock()
			got := append([][]netip.Addr(nil), sets...)
			mu.Unlock()
			if len(got) >= n || time.Now().After(deadline) {
				return got
			}
			time.Sleep(time.Millisecond)
		}
	}

	want := [][]netip.Addr{addrs("10.0.0.2", "192.168.1.5")}
	if diff := cmp.Diff(want, waitSets(1), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Fatalf("first set (-want +got):\n%s", diff)
	}
	event() // nothing changed: no set
	mu.Lock()
	current = addrs("10.0.0.2", "192.168.1.5", "10.244.1.1")
	readErr = errors.New("netlink: interrupted")
	mu.Unlock()
	event() // the read fails: nothing set, an error
	mu.Lock()
	readErr = nil
	setErr = errors.New("map full")
	mu.Unlock()
	event() // the set fails: retried next time
	mu.Lock()
	setErr = nil
	mu.Unlock()
	event()
	want = append(want, addrs("10.0.0.2", "10.244.1.1", "192.168.1.5"))
	if diff := cmp.Diff(want, waitSets(2), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("sets (-want +got):\n%s", diff)
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if errs != 2 {
		t.Errorf("errors reported: %d, want 2 (one read, one set)", errs)
	}
}
