package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sockscale/sockscale/test/cluster"
	"github.com/sockscale/sockscale/test/stack"
)

type flags struct {
	stateDir, kubeBinDir, helm string
	samples                    int
	timeout, upTimeout         time.Duration
	stableWindow, grace        time.Duration
}

// defaultStateDir is ~/.cache/sockscale/bench-coldstart: a cluster of
// its own, apart from `make cluster-up`'s.
func defaultStateDir() string {
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "sockscale", "bench-coldstart")
}

func parseFlags(args []string, out io.Writer) (*flags, error) {
	f := &flags{}
	fs := flag.NewFlagSet("coldstart-node", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&f.stateDir, "state-dir", defaultStateDir(), "the local cluster's state directory")
	fs.StringVar(&f.kubeBinDir, "kube-bin-dir", cluster.DefaultKubeBinDir(), "the control plane's and the real node's binaries (make cluster-binaries real-node-binaries)")
	fs.StringVar(&f.helm, "helm", stack.HelmFromEnv(), "helm binary (default $HELM)")
	fs.IntVar(&f.samples, "samples", 30, "cold starts per node")
	fs.DurationVar(&f.timeout, "timeout", 60*time.Second, "how long one request at zero may take")
	fs.DurationVar(&f.upTimeout, "up-timeout", 20*time.Minute, "how long to wait for the cluster, another's included (one cluster per machine)")
	// The least the controller accepts (controller/internal/config): the
	// stable window is whole seconds from 6s, the grace period from 1s.
	fs.DurationVar(&f.stableWindow, "stable-window", 6*time.Second, "the autoscaler's stable-window (whole seconds, 6s to 1h): how soon an idle target wants no pod")
	fs.DurationVar(&f.grace, "grace", time.Second, "the autoscaler's scale-to-zero-grace-period (1s to 1h): how long in Proxy mode before the last pod goes")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var errs []error
	if f.samples < 1 || f.samples > 1000 {
		errs = append(errs, fmt.Errorf("-samples=%d: want 1 to 1000", f.samples))
	}
	if f.timeout < time.Second || f.timeout > 10*time.Minute {
		errs = append(errs, fmt.Errorf("-timeout=%s: want 1s to 10m", f.timeout))
	}
	if f.upTimeout < time.Minute {
		errs = append(errs, fmt.Errorf("-up-timeout=%s: want at least 1m", f.upTimeout))
	}
	// Checked here: the controller would log a bad value and keep its
	// defaults, and the run would measure something else than it says.
	if f.stableWindow < 6*time.Second || f.stableWindow > time.Hour || f.stableWindow%time.Second != 0 {
		errs = append(errs, fmt.Errorf("-stable-window=%s: want whole seconds from 6s to 1h", f.stableWindow))
	}
	if f.grace < time.Second || f.grace > time.Hour {
		errs = append(errs, fmt.Errorf("-grace=%s: want 1s to 1h", f.grace))
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
	f, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "coldstart-node:", err)
		os.Exit(2)
	}
	// Interrupted, the samples stop and run still takes the cluster down
	// (another user of the machine waits for its lock).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, f, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "coldstart-node:", err)
		os.Exit(1)
	}
}

// run brings the cluster up, installs the chart, measures, prints the
// table, and takes the cluster down whatever happened. Failed samples are
// an error after the table.
func run(ctx context.Context, f *flags, w io.Writer) (err error) {
	say := func(format string, args ...any) {
		fmt.Fprintf(w, "%s ==> "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
	}
	begin := time.Now()
	upCtx, cancel := context.WithTimeout(ctx, f.upTimeout)
	defer cancel()
	say("starting a local cluster: 1 simulated node (%s), 1 real node (%s); waits for any other cluster of this machine to go down", cluster.NodeName(0), cluster.RealNodeName(0))
	c, err := cluster.Up(upCtx, cluster.Options{Nodes: 1, RealNodes: 1, StateDir: f.stateDir, KubeBinDir: f.kubeBinDir})
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
	say("cluster up after %s; pushing the images and the chart", time.Since(begin).Round(time.Second))
	instCtx, cancelInst := context.WithTimeout(ctx, 15*time.Minute)
	defer cancelInst()
	if err := stack.PushImages(instCtx); err != nil {
		return fmt.Errorf("push images: %w", err)
	}
	if err := s.PushChart(instCtx); err != nil {
		return fmt.Errorf("push chart: %w", err)
	}
	if err := s.Install(instCtx, installSets(f)...); err != nil {
		return fmt.Errorf("install the chart: %w", err)
	}
	say("chart installed (%s since start): %v", time.Since(begin).Round(time.Second), installSets(f))
	start := time.Now()
	load := loadAvg()
	results, err := measure(ctx, c, s, f, say)
	fmt.Fprintln(w)
	writeTable(w, f, results, load, loadAvg())
	say("measured in %s (%s since start)", time.Since(start).Round(time.Second), time.Since(begin).Round(time.Second))
	if err != nil {
		return err
	}
	var failed int
	for _, r := range results {
		failed += r.failed()
	}
	if failed > 0 {
		return fmt.Errorf("%d cold starts not answered 200", failed)
	}
	return nil
}

// installSets make an idle target go to zero as soon as the controller
// allows: the shortest stable window and grace period it accepts by
// default. The grace period is no risk to a request: the last pod goes
// only once a probe of the public Service is answered by an activator.
func installSets(f *flags) []string {
	return []string{
		fmt.Sprintf("autoscaler.stable-window=%s", f.stableWindow),
		fmt.Sprintf("autoscaler.scale-to-zero-grace-period=%s", f.grace),
	}
}

// loadAvg is /proc/loadavg's first three fields, for the table's header.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	var one, five, fifteen string
	if _, err := fmt.Sscan(string(b), &one, &five, &fifteen); err != nil {
		return "?"
	}
	return one + " " + five + " " + fifteen
}
