package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sockscale/sockscale/test/cluster"
	"github.com/sockscale/sockscale/test/stack"
)

// clientKind is how the clients hold their connections.
type clientKind string

const (
	keepAlive clientKind = "keepalive"
	newConn   clientKind = "newconn"
)

type flags struct {
	stateDir, kubeBinDir, helm string
	nodes                      int
	tbcs                       []float64
	kinds                      []clientKind
	sleep                      time.Duration
	steady, burst              int
	burstFor, steadyFor        time.Duration
	zeroFor, settleTimeout     time.Duration
}

func parseFlags(args []string) (*flags, error) {
	f := &flags{}
	fs := flag.NewFlagSet("burst", flag.ContinueOnError)
	fs.StringVar(&f.stateDir, "state-dir", cluster.DefaultStateDir(), "the local cluster's state directory")
	fs.StringVar(&f.kubeBinDir, "kube-bin-dir", cluster.DefaultKubeBinDir(), "the control plane's binaries (make cluster-binaries)")
	fs.StringVar(&f.helm, "helm", stack.HelmFromEnv(), "helm binary (default $HELM)")
	fs.IntVar(&f.nodes, "nodes", 2, "simulated nodes")
	tbcs := fs.String("tbc", "211,0,1", "targetBurstCapacity of each target, comma-separated (-1, 0 or > 0)")
	kinds := fs.String("clients", "keepalive,newconn", "client kinds, comma-separated: keepalive (connections reused), newconn (a new connection per request)")
	fs.DurationVar(&f.sleep, "sleep", 50*time.Millisecond, "how long the app holds each request (?sleep=)")
	fs.IntVar(&f.steady, "steady", 56, "requests in flight of the steady scenario (56: 8 pods at target 10 x 70 %)")
	fs.IntVar(&f.burst, "burst", 100, "requests in flight after the burst, and clients arriving at zero")
	fs.DurationVar(&f.burstFor, "burst-duration", 30*time.Second, "how long the burst is measured from its start")
	fs.DurationVar(&f.steadyFor, "steady-duration", 20*time.Second, "how long the steady load is measured once the target settled")
	fs.DurationVar(&f.zeroFor, "zero-duration", 15*time.Second, "how long the clients that arrived at zero keep going")
	fs.DurationVar(&f.settleTimeout, "settle-timeout", 90*time.Second, "how long to wait for the steady load's pods to settle (then measured anyway, marked)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var errs []error
	for _, v := range strings.Split(*tbcs, ",") {
		x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || (x < 0 && x != -1) || x > 10000 {
			errs = append(errs, fmt.Errorf("-tbc=%q: %q is not -1, 0 or a capacity up to 10000", *tbcs, v))
			continue
		}
		f.tbcs = append(f.tbcs, x)
	}
	for _, v := range strings.Split(*kinds, ",") {
		switch k := clientKind(strings.TrimSpace(v)); k {
		case keepAlive, newConn:
			f.kinds = append(f.kinds, k)
		default:
			errs = append(errs, fmt.Errorf("-clients=%q: %q is neither keepalive nor newconn", *kinds, v))
		}
	}
	if f.sleep < time.Millisecond || f.sleep > 5*time.Second {
		errs = append(errs, fmt.Errorf("-sleep=%s: want 1ms to 5s", f.sleep))
	}
	if f.steady < 1 || f.steady > 1000 || f.burst < 2 || f.burst > 1000 {
		errs = append(errs, fmt.Errorf("-steady=%d -burst=%d: want 1 to 1000 and 2 to 1000 in flight", f.steady, f.burst))
	}
	for _, d := range []time.Duration{f.burstFor, f.steadyFor, f.zeroFor} {
		if d < 5*time.Second || d > 10*time.Minute {
			errs = append(errs, fmt.Errorf("a measurement of %s: want 5s to 10m", d))
		}
	}
	if f.helm == "" {
		errs = append(errs, errors.New("-helm: no helm binary (make bench builds the pinned one and sets $HELM)"))
	}
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	return f, errors.Join(errs...)
}

func main() {
	f, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "burst:", err)
		os.Exit(2)
	}
	// Interrupted, the loads stop and run still takes the cluster down
	// (another user of the machine waits for its lock).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, f, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "burst:", err)
		os.Exit(1)
	}
}

// run brings the cluster up, installs the chart, measures, prints the
// table, and takes the cluster down whatever happened.
func run(ctx context.Context, f *flags, w io.Writer) (err error) {
	say := func(format string, args ...any) {
		fmt.Fprintf(w, "%s ==> "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
	}
	begin := time.Now()
	upCtx, cancel := context.WithTimeout(ctx, 8*time.Minute)
	defer cancel()
	say("starting a %d-node local cluster", f.nodes)
	c, err := cluster.Up(upCtx, cluster.Options{Nodes: f.nodes, StateDir: f.stateDir, KubeBinDir: f.kubeBinDir})
	if c != nil {
		// Up leaves what it started for Down even when it fails.
		defer func() {
			say("taking the cluster down")
			if derr := c.Down(); derr != nil {
				err = errors.Join(err, fmt.Errorf("cluster down: %w", derr))
			}
		}()
	}
	if err != nil {
		return fmt.Errorf("cluster up: %w", err)
	}
	s, err := stack.New(c.Config, c.Kubeconfig, f.helm, cluster.ServiceCIDR)
	if err != nil {
		return fmt.Errorf("connect to the cluster: %w", err)
	}
	say("cluster up in %s; pushing the images and the chart", time.Since(begin).Round(time.Second))
	if err := stack.PushImages(upCtx); err != nil {
		return fmt.Errorf("push images: %w", err)
	}
	if err := s.PushChart(upCtx); err != nil {
		return fmt.Errorf("push chart: %w", err)
	}
	// The e2e tests' short stable window keeps the settling and the
	// scale to zero within the run's budget; the rest is the chart's
	// defaults.
	if err := s.Install(upCtx, "autoscaler.stable-window=20s"); err != nil {
		return fmt.Errorf("install the chart: %w", err)
	}
	say("chart installed (%s since start)", time.Since(begin).Round(time.Second))
	start := time.Now()
	rows, err := measure(ctx, c, s, f, say)
	fmt.Fprintln(w)
	writeTable(w, f, rows)
	say("measured in %s (%s since start)", time.Since(start).Round(time.Second), time.Since(begin).Round(time.Second))
	return err
}
