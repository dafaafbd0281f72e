//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf"
)

// TestProgClientSegmentsOnTwoCPUs: ingress runs before TCP takes the
// socket's lock, so the kernel can hand it two segments of one connection
// at once, on two CPUs (over veth or loopback each is received on the CPU
// that sent it). An HTTP/2 client's segments, each opening and resetting
// many streams, are run in pairs on two threads, the second started as
// soon as the first begins: on every connection either every stream is
// counted, or (the second overtook the first: a hole inside frame headers
// that the walk cannot skip) the connection says it fell back to
// connection level. Never a followed connection with streams missing,
// which is what two walks sharing one parse state produced.
func TestProgClientSegmentsOnTwoCPUs(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skipf("needs two CPUs to run two segments at once; this machine has %d", runtime.NumCPU())
	}
	h := newProgHarness(t)
	const conns, pairs, streamsPerSeg = 40, 12, 90
	var exact, fellBack, waits uint64
	for i := range conns {
		h.reset()
		x := newH2Exchange(h)
		x.cli.settings()
		x.in(h2ClientPreface + x.cli.take())
		// Segments of whole frames, in sequence: streams opened and reset
		// by the client (RST_STREAM ends a stream on ingress), so that
		// only the client's side runs and none stays in flight.
		var pkts [][]byte
		sid := uint32(1)
		for range 2 * pairs {
			for range streamsPerSeg {
				x.cli.request(sid).rst(sid)
				sid += 2
			}
			seg := x.cli.take()
			pkts = append(pkts, packet(h.peer, h.pod, testPeerPort, testPodPort, 1000+x.rx, []byte(seg)))
			x.rx += uint32(len(seg))
		}
		if err := runInPairs(h.objs.SockscaleIngress, pkts); err != nil {
			t.Fatal(err)
		}
		got, ev := h.counts(), h.events()
		streams := int64(2 * pairs * streamsPerSeg)
		waits += ev[evRxWait]
		switch {
		case got.OpaqueTotal == 1 && ev[evH2Lost] == 1:
			fellBack++ // a pair overtook: said so
		case got.OpaqueTotal == 0 && got.Started == streams && got.Completed == streams && got.InFlight == 0:
			exact++
		default:
			t.Errorf("connection %d: %d streams opened and reset, counted %+v, events %v; want every one counted or the connection at connection level", i, streams, got, ev)
		}
		if ev[evRxTakeover] != 0 {
			t.Errorf("connection %d: %d segments waited past the bound for the other CPU and took the connection over", i, ev[evRxTakeover])
		}
	}
	t.Logf("%d connections: %d counted exactly, %d fell back (a segment overtook the one before), %d segments waited for the other CPU", conns, exact, fellBack, waits)
	if waits == 0 {
		t.Errorf("no segment ever waited for the other CPU: the pairs never ran at once, so this test showed nothing")
	}
}

// runInPairs runs pkts through prog in pairs on two OS threads: the odd
// one starts as soon as the even one before it is about to, and the next
// pair once both are done.
func runInPairs(prog *ebpf.Program, pkts [][]byte) error {
	var begun, done atomic.Int64 // pairs whose first was begun; whose second is done
	errs := make([]error, 2)
	var wg sync.WaitGroup
	run := func(worker int) {
		defer wg.Done()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for pair := int64(0); 2*pair+1 < int64(len(pkts)); pair++ {
			if worker == 0 {
				for done.Load() < pair {
					runtime.Gosched()
				}
				begun.Store(pair + 1)
			} else {
				for begun.Load() <= pair {
				}
			}
			ret, err := prog.Run(&ebpf.RunOptions{Data: pkts[2*pair+int64(worker)]})
			if err == nil && ret != 1 {
				err = fmt.Errorf("verdict %d, want 1 (the programs never drop)", ret)
			}
			if err != nil {
				errs[worker] = fmt.Errorf("segment %d: %w", 2*pair+int64(worker), err)
				done.Store(int64(len(pkts))) // the other stops waiting
				begun.Store(int64(len(pkts)))
				return
			}
			if worker == 1 {
				done.Store(pair + 1)
			}
		}
	}
	wg.Add(2)
	go run(0)
	go run(1)
	wg.Wait()
	return errors.Join(errs...)
}

// TestProgClaimNobodyGivesBack: a connection whose client side is claimed
// by nobody (a state copied while another CPU walked it) costs its next
// segment one bounded wait, which then walks it all the same and leaves
// the connection free.
func TestProgClaimNobodyGivesBack(t *testing.T) {
	h := newProgHarness(t)
	c := h.conn()
	c.Rx.Walking = 1
	if err := h.objs.Conns.Update(&h.key, &c, ebpf.UpdateExist); err != nil {
		t.Fatal(err)
	}
	h.ingress(1000, get)
	if got := h.counts(); got.Started != 1 || got.InFlight != 1 {
		t.Errorf("a request after the stale claim: %+v, want it counted", got)
	}
	if ev := h.events(); ev[evRxWait] != 1 || ev[evRxTakeover] != 1 {
		t.Errorf("events %v: want one wait and one takeover", ev)
	}
	if w := h.conn().Rx.Walking; w != 0 {
		t.Errorf("claim after the walk = %d, want 0 (given back)", w)
	}
	h.ingress(1000+uint32(len(get)), get)
	if ev := h.events(); ev[evRxWait] != 1 {
		t.Errorf("events %v after a second request: want no further wait", ev)
	}
}
