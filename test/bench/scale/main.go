package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/test/bench/harness"
)

func main() {
	targets := flag.String("targets", "1000,3000,10000", "comma-separated PodAutoscaler counts, one scale point and fresh control plane each (nodes = targets/2, 100 pods per node)")
	cold := flag.Int("cold", 50, "targets at zero each point pokes once each")
	warmup := flag.Duration("warmup", 20*time.Second, "how long each point runs at steady state before its window")
	duration := flag.Duration("duration", 60*time.Second, "each point's measurement window")
	steady := flag.Duration("steady-timeout", 10*time.Minute, "how long each point waits for every target to be decided at its pods")
	controller := flag.String("controller", "", "sockscale-controller binary to measure (empty: build this tree's)")
	replicas := flag.String("replicas", "1", "comma-separated controller replica counts each point runs with (more than 1: leader election and --buckets, the agents routing records to their buckets' replicas)")
	buckets := flag.Int("buckets", 0, "--buckets of the controllers when more than one replica runs (0: twice the replicas)")
	others := flag.Int("others", 0, "other workloads the cluster also runs, each a Deployment as users write them and a 100-pod EndpointSlice, in namespace "+othersNamespace+" (what the rest of a cluster costs the controller's caches)")
	profile := flag.String("profile", "", "directory for every controller replica's and the API server's CPU profile (the window's first 30 s) and the replicas' heap profiles (its end), per scale point: scale-<targets>[x<replicas>]-{r<k>-cpu,r<k>-heap,apiserver-cpu}.pprof (empty: none)")
	flag.Parse()
	ts, err := parseTargets(*targets)
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(2)
	}
	rs, err := parseCounts("-replicas", *replicas, 1, "1,2")
	if err == nil && (*buckets < 0 || *buckets == 1 || *buckets > stats.MaxBuckets) {
		err = fmt.Errorf("-buckets %d: want 0 (twice the replicas) or 2..%d", *buckets, stats.MaxBuckets)
	}
	if err == nil && (*others < 0 || *others > maxOthers) {
		err = fmt.Errorf("-others %d: want 0..%d other workloads", *others, maxOthers)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(2)
	}
	// Interrupted, each point still stops its controllers and control
	// plane (harness.AtInterrupt), which would outlive this process.
	harness.OnInterrupt(func() {})
	err = scale(scaleOptions{targets: ts, cold: *cold, warmup: *warmup, window: *duration, steadyTimeout: *steady,
		controller: *controller, profileDir: *profile, replicas: rs, buckets: *buckets, others: *others})
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}
