//go:build linux

package bpf

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sockscale/sockscale/internal/testutil/loadgen"
)

// TestKernelPodSlotReuse follows a pod's counter slot through the agent's
// pod churn: a removed pod's connection that is still open must not count
// into the pod that gets its slot next, and a pod added again counts anew.
func TestKernelPodSlotReuse(t *testing.T) {
	e := newKernelEnv(t, "")
	other := netip.MustParseAddr("10.213.251.2") // a pod with no traffic

	// A request in flight on the pod's connection...
	done := make(chan error, 1)
	go func() {
		resp, err := http.Get(e.url("sleep=400ms"))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	e.waitCounters(t, "request in flight", func(c PodCounters) bool { return c.Requests.InFlight == 1 })
	// ...while the pod goes and another pod takes its slot, the lowest free.
	if err := e.acct.RemovePod(e.pod.IP); err != nil {
		t.Fatal(err)
	}
	if err := e.acct.AddPod(other, 2); err != nil {
		t.Fatal(err)
	}
	if got := e.acct.slots[other]; got != 0 {
		t.Fatalf("the new pod got slot %d, want 0 (the one just freed)", got)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	snap, err := e.acct.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[netip.Addr]PodCounters{other: {}}, snap.Pods); diff != "" {
		t.Errorf("after the old pod's response (-want +got):\n%s", diff)
	}

	// The pod comes back (a new slot): new connections count, from zero.
	if err := e.acct.AddPod(e.pod.IP, 1); err != nil {
		t.Fatal(err)
	}
	if got := e.acct.slots[e.pod.IP]; got != 1 {
		t.Errorf("the pod added again got slot %d, want 1", got)
	}
	http.DefaultClient.CloseIdleConnections() // the old connection is not the new pod's
	resp, err := http.Get(e.url("size=1"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got := e.waitCounters(t, "the pod added again counts", func(c PodCounters) bool { return c.Requests.Completed == 1 })
	if got.Requests.Started != 1 || got.ConnsTotal != 1 {
		t.Errorf("pod added again: started=%d conns=%d, want 1 and 1", got.Requests.Started, got.ConnsTotal)
	}
	pods, err := e.acct.Pods()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[netip.Addr]uint64{e.pod.IP: 1, other: 2}, pods); diff != "" {
		t.Errorf("Pods (-want +got):\n%s", diff)
	}
}

// TestKernelPodSlotLimits checks the pod map's bad inputs and its capacity:
// every slot can be used, one pod more is a clear error, and a freed slot
// is used again.
func TestKernelPodSlotLimits(t *testing.T) {
	e := newKernelEnv(t, "")
	if err := e.acct.AddPod(e.pod.IP, 0); err == nil {
		t.Error("AddPod with id 0 succeeded; 0 marks a free slot and must be refused")
	}
	if err := e.acct.AddPod(netip.Addr{}, 7); err == nil {
		t.Error("AddPod of no address succeeded")
	}
	if err := e.acct.AddPod(netip.MustParseAddr("fe80::1%eth0"), 7); err == nil {
		t.Error("AddPod of an address with a zone succeeded; a pod's address has none")
	}
	// A dual-stack pod: one slot per address, the same id in both; an
	// IPv4-mapped address is its IPv4 address.
	v6 := netip.MustParseAddr("fd5c:a1e:0:214::7")
	for _, ip := range []netip.Addr{v6, netip.MustParseAddr("::ffff:10.216.0.7")} {
		if err := e.acct.AddPod(ip, 7); err != nil {
			t.Fatalf("AddPod(%s): %v", ip, err)
		}
	}
	pods, err := e.acct.Pods()
	if err != nil {
		t.Fatal(err)
	}
	if pods[v6] != 7 || pods[netip.MustParseAddr("10.216.0.7")] != 7 {
		t.Errorf("Pods() = %v, want %s and 10.216.0.7 (unmapped) with id 7", pods, v6)
	}
	for _, ip := range []netip.Addr{v6, netip.MustParseAddr("10.216.0.7")} {
		if err := e.acct.RemovePod(ip); err != nil {
			t.Fatalf("RemovePod(%s): %v", ip, err)
		}
	}
	// The env's pod has slot 0; fill the rest.
	ip := netip.MustParseAddr("10.214.0.0")
	for range MaxPods - 1 {
		ip = ip.Next()
		if err := e.acct.AddPod(ip, 9); err != nil {
			t.Fatalf("add pod %s of %d: %v", ip, MaxPods, err)
		}
	}
	if err := e.acct.AddPod(netip.MustParseAddr("10.215.0.1"), 9); !errors.Is(err, ErrPodMapFull) {
		t.Fatalf("AddPod beyond %d pods: err = %v, want ErrPodMapFull", MaxPods, err)
	}
	if err := e.acct.RemovePod(ip); err != nil {
		t.Fatal(err)
	}
	if err := e.acct.AddPod(netip.MustParseAddr("10.215.0.1"), 9); err != nil {
		t.Fatalf("AddPod into a freed slot: %v", err)
	}
	snap, err := e.acct.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Pods) != MaxPods {
		t.Errorf("snapshot of a full map has %d pods, want %d", len(snap.Pods), MaxPods)
	}
}

// TestKernelSlotReuseRace churns a loaded pod's slot: the pod is removed,
// a pod with no traffic at all takes the slot, then goes, and the first pod
// is added back (a new id, so its open connections stop counting), again
// and again while clients keep requests and connections coming. The pod
// without traffic must read zero every time: its slot must never get a
// count of a connection that checked the slot's owner before the agent
// reset it (the owner check and the counting are one step under the slot's
// lock, and the agent resets the slot under the same lock).
func TestKernelSlotReuseRace(t *testing.T) {
	e := newKernelEnv(t, "")
	idle := netip.MustParseAddr("10.213.251.3") // a pod with no traffic
	// Keep-alive clients count requests on every segment; new connections
	// are counted by sock_ops on accept.
	keep := loadgen.Start(context.Background(), loadgen.Options{URLs: []string{e.url("size=1")}, Concurrency: 6, KeepAlive: true})
	dial := loadgen.Start(context.Background(), loadgen.Options{URLs: []string{e.url("size=1")}, Concurrency: 4, KeepAlive: false})
	defer dial.Stop()
	defer keep.Stop()
	time.Sleep(200 * time.Millisecond)

	torn, rounds := 0, 0
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); rounds++ {
		if err := e.acct.RemovePod(e.pod.IP); err != nil {
			t.Fatal(err)
		}
		if err := e.acct.AddPod(idle, 2); err != nil {
			t.Fatal(err)
		}
		snap, err := e.acct.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if got := snap.Pods[idle]; got != (PodCounters{}) {
			if torn == 0 {
				t.Errorf("round %d: the pod without traffic has counters %+v, want none", rounds, got)
			}
			torn++
		}
		if err := e.acct.RemovePod(idle); err != nil {
			t.Fatal(err)
		}
		if err := e.acct.AddPod(e.pod.IP, uint64(10+rounds)); err != nil {
			t.Fatal(err)
		}
	}
	if torn > 0 {
		t.Errorf("%d of %d rounds gave the idle pod counts", torn, rounds)
	}
	if res := keep.Stop(); res.Completed == 0 {
		t.Error("no keep-alive request completed")
	}
	if res := dial.Stop(); res.Completed == 0 {
		t.Error("no request on a new connection completed")
	}
	t.Logf("%d rounds", rounds)
}

// TestKernelPodAddedAgainInItsSlot removes a pod while a request is in
// flight and adds the same pod (same address and id) again, which takes
// the same slot: its counters start from zero, and the request counted
// before must not complete into them (N would read -1).
func TestKernelPodAddedAgainInItsSlot(t *testing.T) {
	e := newKernelEnv(t, "")
	done := make(chan error, 1)
	go func() {
		resp, err := http.Get(e.url("sleep=400ms"))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	e.waitCounters(t, "request in flight", func(c PodCounters) bool { return c.Requests.InFlight == 1 })
	slot := e.acct.slots[e.pod.IP]
	if err := e.acct.RemovePod(e.pod.IP); err != nil {
		t.Fatal(err)
	}
	if err := e.acct.AddPod(e.pod.IP, 1); err != nil {
		t.Fatal(err)
	}
	if got := e.acct.slots[e.pod.IP]; got != slot {
		t.Fatalf("the pod added again got slot %d, want %d (its own, the lowest free)", got, slot)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the response's segments reach egress
	got, _ := e.counters(t)
	if got != (PodCounters{}) {
		t.Errorf("after the request of the pod's previous term completed: %+v, want zero counters", got)
	}
}
