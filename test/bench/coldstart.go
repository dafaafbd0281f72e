package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"text/tabwriter"
	"time"

	"github.com/sockscale/sockscale/test/bench/harness"
)

// coldPortBase is the first pod port the cold starts use; each cold start
// takes the next, so each is a new pod to the activator.
const coldPortBase = 9100

// coldSample is one cold start, timed from the instant the pod's listener
// opened (t0: the pod answers from then on).
type coldSample struct {
	forwarded  time.Duration // t0 -> the held request arrives at the pod: the activator's share
	probeWait  time.Duration // t0 -> the first probe arrives: the wait for the next probe tick
	probeToFwd time.Duration // that probe -> the held request arrives: the activator's reaction
}

// coldStart measures the activator's share of a cold start: a request is
// held for a target whose only pod does not listen yet (the activator
// probes it), then the pod's listener opens at a known instant, after a
// random fraction of a probe period; the share is from that instant to the
// held request's arrival at the pod. One row per probe period, each with
// an activator of its own.
func (b *bench) coldStart(n int, periods []time.Duration) error {
	if n < 1 {
		return fmt.Errorf("-cold-starts %d: want at least 1", n)
	}
	rig, err := b.activatorRig()
	if err != nil {
		return err
	}
	const name = "cold"
	port := coldPortBase
	if err := rig.createTarget(name, 0, netip.AddrPortFrom(b.pod.IP, uint16(port)), false); err != nil {
		return err
	}
	defer func() { _ = rig.deleteTarget(name) }()

	fmt.Printf("\nCold start, the activator's share: from the pod's listen() to the held request's arrival at the pod; %d cold starts per row\n", n)
	fmt.Println("The pod opens its listener a random fraction of a probe period after the request is held; probe wait: listen() -> first probe;")
	fmt.Println("probe -> forward: that probe -> the held request (probe answered, pod marked ready, request handed over, connection dialled, sent).")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "probe period\tcold starts\tp50\tp95\tmax\tmean\tprobe wait p50\tprobe wait p95\tprobe -> forward p50\tprobe -> forward p95\t")
	rng := rand.New(rand.NewPCG(3, 3))
	for _, period := range periods {
		// A fresh activator probes the slice's pod (not listening) from
		// the moment it is ready.
		a, err := rig.start("--probe-period=" + period.String())
		if err != nil {
			return err
		}
		var samples []coldSample
		for i := range n {
			if i > 0 {
				// A new pod: the last one is ready, and the throttle's
				// ready set empties as the prober starts probing this one.
				port++
				if err := rig.setPod(name, netip.AddrPortFrom(b.pod.IP, uint16(port)), false); err != nil {
					a.stop()
					return err
				}
				if err := a.waitMetric("the last pod gone", 10*time.Second, func(m harness.PromSamples) bool {
					return m.Value("sockscale_activator_pods", targetLabels(name, "state", "ready")...) == 0
				}); err != nil {
					a.stop()
					return err
				}
			}
			s, err := b.coldOnce(a, name, port, time.Duration(rng.Int64N(int64(period))))
			if err != nil {
				a.stop()
				return fmt.Errorf("cold start %d (probe period %v): %w", i+1, period, err)
			}
			samples = append(samples, s)
		}
		a.stop()
		port++ // the next activator starts on a pod no one listens on
		if err := rig.setPod(name, netip.AddrPortFrom(b.pod.IP, uint16(port)), false); err != nil {
			return err
		}
		fwd, wait, react := make([]time.Duration, n), make([]time.Duration, n), make([]time.Duration, n)
		var sum time.Duration
		for i, s := range samples {
			fwd[i], wait[i], react[i] = s.forwarded, s.probeWait, s.probeToFwd
			sum += s.forwarded
		}
		ms := func(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/1e6) }
		fmt.Fprintf(w, "%v\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", period, n, ms(harness.Percentile(fwd, 0.5)), ms(harness.Percentile(fwd, 0.95)),
			ms(harness.Percentile(fwd, 1)), ms(sum/time.Duration(n)), ms(harness.Percentile(wait, 0.5)), ms(harness.Percentile(wait, 0.95)),
			ms(harness.Percentile(react, 0.5)), ms(harness.Percentile(react, 0.95)))
	}
	return w.Flush()
}

// coldOnce holds one request for the target, whose pod on port does not
// listen and is being probed, opens the pod's listener delay after the
// request is held, and times the rest.
func (b *bench) coldOnce(a *activatorProc, name string, port int, delay time.Duration) (coldSample, error) {
	type answer struct {
		code int
		body string
		err  error
	}
	answered := make(chan answer, 1)
	client := a.client(1, 0)
	defer client.CloseIdleConnections()
	go func() {
		resp, err := client.Get(targetURL(name))
		if err != nil {
			answered <- answer{err: err}
			return
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		answered <- answer{resp.StatusCode, string(body), err}
	}()
	if err := a.waitMetric("the request held", 10*time.Second, func(m harness.PromSamples) bool {
		return m.Value("sockscale_activator_requests_in_flight", targetLabels(name, "state", "held")...) == 1
	}); err != nil {
		return coldSample{}, err
	}
	time.Sleep(delay)
	pod, err := startPodServer(b.pod, port)
	if err != nil {
		return coldSample{}, err
	}
	defer pod.close()
	var ans answer
	select {
	case ans = <-answered:
	case <-time.After(15 * time.Second):
		return coldSample{}, fmt.Errorf("no answer 15s after the pod started listening")
	}
	if ans.err != nil {
		return coldSample{}, fmt.Errorf("held request: %w", ans.err)
	}
	if ans.code != 200 || ans.body != "ok" {
		return coldSample{}, fmt.Errorf("held request: %d %q, want 200 \"ok\"", ans.code, ans.body)
	}
	probe, fwd := pod.times()
	if probe.IsZero() || fwd.IsZero() {
		return coldSample{}, fmt.Errorf("the pod saw no probe (%v) or no forwarded request (%v)", probe, fwd)
	}
	return coldSample{forwarded: fwd.Sub(pod.listening), probeWait: probe.Sub(pod.listening), probeToFwd: fwd.Sub(probe)}, nil
}
