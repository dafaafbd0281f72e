package main

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/sockscale/sockscale/test/bench/harness"
)

const (
	// holdPort is the port of the hold target's pod.
	holdPort = 9900
	// holdCC is the hold target's containerConcurrency: on release the
	// activator forwards this many at a time (unlimited, it would open a
	// connection to the pod per held request, as many again as it holds).
	holdCC = 100
	// dialers bounds the client's connection attempts at once: thousands
	// at once overflow the accept queue and then wait out SYN retries.
	dialers = 256
)

// hold holds n requests for one target whose pod does not listen yet, in a
// fresh activator, and reports what holding them costs the activator's
// memory (resident set, and the Go heap and stacks from its /metrics);
// then the pod starts listening and every held request must be answered.
func (b *bench) hold(n int) error {
	if n < 1 {
		return fmt.Errorf("-held %d: want at least 1", n)
	}
	rig, err := b.activatorRig()
	if err != nil {
		return err
	}
	const name = "hold"
	if err := rig.createTarget(name, holdCC, netip.AddrPortFrom(b.pod.IP, holdPort), false); err != nil {
		return err
	}
	defer func() { _ = rig.deleteTarget(name) }()
	a, err := rig.start("--queue-depth=" + strconv.Itoa(max(n, 10000)))
	if err != nil {
		return err
	}
	defer a.stop()
	pid := a.cmd.Process.Pid

	time.Sleep(time.Second) // the activator settles: caches synced, the pod probed
	m0, err := a.metrics()
	if err != nil {
		return err
	}
	rss0 := harness.ProcessRSS(pid)

	client := a.client(n, dialers)
	defer client.CloseIdleConnections()
	var wg sync.WaitGroup
	var ok atomic.Int64
	var failures sync.Map // first answer of each kind that was not a 200 "ok"
	start := time.Now()
	for range n {
		wg.Go(func() {
			resp, err := client.Get(targetURL(name))
			if err != nil {
				failures.LoadOrStore(err.Error(), 1)
				return
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 || string(body) != "ok" {
				failures.LoadOrStore(fmt.Sprintf("%d %q %v", resp.StatusCode, body, err), 1)
				return
			}
			ok.Add(1)
		})
	}
	held := func(m harness.PromSamples) float64 {
		return m.Value("sockscale_activator_requests_in_flight", targetLabels(name, "state", "held")...)
	}
	if err := a.waitMetric(fmt.Sprintf("%d requests held", n), 2*time.Minute, func(m harness.PromSamples) bool { return held(m) == float64(n) }); err != nil {
		return err
	}
	allHeld := time.Since(start)
	time.Sleep(time.Second) // let the last connections' buffers and goroutines settle
	m1, err := a.metrics()
	if err != nil {
		return err
	}
	rss1 := harness.ProcessRSS(pid)
	if h := held(m1); h != float64(n) {
		return fmt.Errorf("%v requests held, want %d", h, n)
	}

	pod, err := startPodServer(b.pod, holdPort)
	if err != nil {
		return err
	}
	defer pod.close()
	wg.Wait()
	released := time.Since(pod.listening)

	perHeld := func(metric string) string {
		return fmt.Sprintf("%.1f KB", (m1.Value(metric)-m0.Value(metric))/float64(n)/1024)
	}
	fmt.Printf("\nHold: %d requests held for one target with no ready pod (a fresh activator; containerConcurrency %d on release); memory is the activator's\n", n, holdCC)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "held\tall held after\tRSS before\tRSS held\tRSS/held\theap in use/held\tstacks/held\tgoroutines/held\tpod ready -> all answered\tanswered 200\t")
	fmt.Fprintf(w, "%d\t%v\t%.1f MB\t%.1f MB\t%.1f KB\t%s\t%s\t%.2f\t%v\t%d\t\n", n, allHeld.Round(time.Millisecond),
		float64(rss0)/(1<<20), float64(rss1)/(1<<20), float64(rss1-rss0)/float64(n)/1024,
		perHeld("go_memstats_heap_inuse_bytes"), perHeld("go_memstats_stack_inuse_bytes"),
		(m1.Value("go_goroutines")-m0.Value("go_goroutines"))/float64(n), released.Round(time.Millisecond), ok.Load())
	if err := w.Flush(); err != nil {
		return err
	}
	if ok.Load() != int64(n) {
		var kinds []string
		failures.Range(func(k, _ any) bool { kinds = append(kinds, k.(string)); return len(kinds) < 5 })
		return fmt.Errorf("hold: %d of %d held requests answered 200 after the pod became ready; failures: %q", ok.Load(), n, kinds)
	}
	return nil
}
