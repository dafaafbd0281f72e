package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/internal/testutil/testpod"
)

// activatorPath compares a trivial handler's warm data path three ways on
// the same pod, as dataPath does (the same interleaved slices and
// intervals): "direct" to the pod's server, "activator" through the real
// activator with the target at TBC = -1 (the client calls the target by
// name, the activator resolves the Host, takes a slot and forwards to the
// pod's address over its keep-alive pool) to that same server, and
// "queue-proxy" through Knative's queue-proxy in the pod in front of an
// identical server. Both proxies are Go reverse proxies with no
// concurrency limit (containerConcurrency 0).
//
// There is no crossover here: the differences sought are several times
// the few percent two servers differ by. Each block of rounds gives one
// estimate of each comparison (the mean over its rounds), and the table
// gives their mean and 95 % confidence interval over the blocks.
func (b *bench) activatorPath(slice time.Duration, rounds, block int, concurrencies []int, queueProxy string) error {
	if block < 1 || rounds < 2*block {
		return fmt.Errorf("-activator-rounds %d, -activator-block %d: a confidence interval needs at least two blocks of at least one round", rounds, block)
	}
	const name = "warm"
	a, stop, err := b.warmTarget(name, 0, netip.AddrPortFrom(b.pod.IP, testpod.HTTPPort))
	if err != nil {
		return err
	}
	defer stop()
	modes := []string{"direct", "activator"}
	if queueProxy != "" {
		if err := b.startQueueProxy(queueProxy, queueProxyConfig{userPort: b.proxyBackend.port}); err != nil {
			return err
		}
		modes = append(modes, "queue-proxy")
	}
	// The control plane the activator watches runs all along, and on a
	// shared machine other work too: what the machine does without our
	// load is in every row's CPU, most in the slowest rows'.
	idle0, _ := machineStat()
	time.Sleep(time.Second)
	idle1, _ := machineStat()

	blocks := rounds / block
	fmt.Printf("\nData path through the activator (TBC = -1): trivial handler, keep-alive, closed loop; per c %d blocks of %d rounds, each mode %v per round, modes taking turns\n", blocks, block, slice)
	fmt.Println("direct: to the pod; activator: the real sockscale-activator on this host, forwarding to the same server; queue-proxy: Knative's, in the pod.")
	fmt.Println("Ratios and differences are per round, averaged over each block: geometric mean (ratios) or mean (differences) over the blocks [95 % confidence interval].")
	fmt.Printf("CPU is the whole machine's (load generator included, and what runs without our load: %.0f %% of a core before the table, the idle control plane and other work).\n", 100*(idle1-idle0).Seconds())
	fmt.Println("proxy CPU/req: the proxy process's own CPU time (all its threads' schedstat), which the machine's other work does not blur.")
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "c\tmode\t"+comparedHeader("direct")+"\tproxy CPU/req\t")
	procs := map[string]int{"activator": a.cmd.Process.Pid, "queue-proxy": b.queueProxyPid}
	var versusQP, garbage []string
	for _, c := range concurrencies {
		urls := map[string]string{"direct": "http://" + b.pod.Addr(testpod.HTTPPort) + "/", "activator": targetURL(name),
			"queue-proxy": "http://" + b.pod.Addr(queueProxyPort) + "/"}
		m0, err := a.metrics()
		if err != nil {
			return err
		}
		loads := map[string]loadgen.Options{}
		for _, m := range modes {
			client := loadgen.NewClient(c, true)
			if m == "activator" {
				client = a.client(c, 0)
			}
			defer client.CloseIdleConnections()
			loads[m] = keepAliveLoop(urls[m], c, client)
			closedLoop(loads[m], slice) // warm up connections and caches
		}
		all := map[string][]result{}
		est, vsQP := estimates{}, estimates{}
		var procRatio []float64 // per block: log of the activator's own CPU/req over queue-proxy's
		rng := rand.New(rand.NewPCG(uint64(c), 2))
		for range blocks {
			rs, err := interleave(modes, loads, procs, slice, block, rng)
			if err != nil {
				return err
			}
			for _, m := range modes {
				all[m] = append(all[m], rs[m]...)
			}
			est.add(roundMeans(rs, modes, "direct"))
			if queueProxy != "" {
				vsQP.add(roundMeans(rs, modes, "queue-proxy"))
				var mean float64
				for i, r := range rs["activator"] {
					mean += math.Log(r.procPerRequest().Seconds()/rs["queue-proxy"][i].procPerRequest().Seconds()) / float64(block)
				}
				procRatio = append(procRatio, mean)
			}
		}
		m1, err := a.metrics()
		if err != nil {
			return err
		}
		delta := func(metric string, labels ...string) float64 {
			return m1.Value(metric, labels...) - m0.Value(metric, labels...)
		}
		forwarded := delta("sockscale_activator_hold_results_total", targetLabels(name, "result", "forwarded")...)
		garbage = append(garbage, fmt.Sprintf("c=%d %.1f KB allocated and %.2f GC cycles per 1000 requests", c,
			delta("go_memstats_alloc_bytes_total")/forwarded/1024, 1000*delta("go_gc_duration_seconds")/forwarded))
		for _, m := range modes {
			merged, proc := merge(all[m]), "-"
			if m != "direct" {
				proc = merged.procPerRequest().Round(100 * time.Nanosecond).String()
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t\n", c, m, comparedCells(m, merged, est, m == "direct"), proc)
		}
		if queueProxy != "" {
			versusQP = append(versusQP, fmt.Sprintf("c=%d: rps %s, CPU/req %s, CPU/req beyond direct %s, proxy's own CPU/req %s", c,
				ratioCI(vsQP.ci("activator", logRatio)), ratioCI(vsQP.ci("activator", logCPURatio)), ratioCI(meanCI(addedCPURatios(est))),
				ratioCI(meanCI(procRatio))))
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Println("The activator's Go heap per request forwarded (its go_memstats_alloc_bytes_total and go_gc_duration_seconds count):", strings.Join(garbage, ", "))
	if len(versusQP) > 0 {
		fmt.Println("Activator over queue-proxy (per round, geometric mean over the blocks [95 % CI]; beyond direct: each proxy's machine CPU/req minus direct's, per block):")
		fmt.Println("  " + strings.Join(versusQP, "\n  "))
	}
	return nil
}

// addedCPURatios are, per block of est, the logs of the CPU per request
// the activator adds to direct over what queue-proxy adds: the two
// proxies' own costs compared.
func addedCPURatios(est estimates) []float64 {
	var logs []float64
	for k := range est["activator"] {
		logs = append(logs, math.Log(est["activator"][k][extraCPU]/est["queue-proxy"][k][extraCPU]))
	}
	return logs
}
