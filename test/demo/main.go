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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sockscale/sockscale/controller/api/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/test/cluster"
	"github.com/sockscale/sockscale/test/stack"
)

type flags struct {
	stateDir, binDir, kubeBinDir, helm, out string
	nodes                                   int
	ramp                                    []int
	step                                    time.Duration
}

func parseFlags(args []string) (*flags, error) {
	f := &flags{}
	fs := flag.NewFlagSet("sockscale-demo", flag.ContinueOnError)
	fs.StringVar(&f.stateDir, "state-dir", cluster.DefaultStateDir(), "the local cluster's state directory")
	fs.StringVar(&f.binDir, "bin-dir", "bin", "the images' binaries (make build)")
	fs.StringVar(&f.kubeBinDir, "kube-bin-dir", cluster.DefaultKubeBinDir(), "the control plane's binaries (make cluster-binaries)")
	fs.StringVar(&f.helm, "helm", stack.HelmFromEnv(), "helm binary (default $HELM)")
	fs.StringVar(&f.out, "out", "out/demo.png", "where the timeline plot is written")
	fs.IntVar(&f.nodes, "nodes", 2, "simulated nodes")
	ramp := fs.String("ramp", "5,14,28,42,28,7,0", "offered concurrency of each step (comma-separated)")
	fs.DurationVar(&f.step, "step", 30*time.Second, "how long each step of the ramp lasts")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var errs []error
	for _, v := range strings.Split(*ramp, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 0 || n > 500 {
			errs = append(errs, fmt.Errorf("--ramp=%q: %q is not a concurrency from 0 to 500", *ramp, v))
			continue
		}
		f.ramp = append(f.ramp, n)
	}
	if f.step < 5*time.Second || f.step > 10*time.Minute {
		errs = append(errs, fmt.Errorf("--step=%s: want 5s to 10m", f.step))
	}
	if f.helm == "" {
		errs = append(errs, errors.New("--helm: no helm binary (make demo builds the pinned one and sets $HELM)"))
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
		fmt.Fprintln(os.Stderr, "sockscale-demo:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, f, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "sockscale-demo:", err)
		os.Exit(1)
	}
}

const (
	appName = "hello"
	appNS   = "demo"
)

func run(ctx context.Context, f *flags, w io.Writer) error {
	say := func(format string, args ...any) { fmt.Fprintf(w, "==> "+format+"\n", args...) }
	start := time.Now()
	say("starting a %d-node local cluster (real etcd, kube-apiserver, controller-manager, scheduler, kube-proxy, CoreDNS; simulated nodes)", f.nodes)
	upCtx, cancel := context.WithTimeout(ctx, 8*time.Minute)
	defer cancel()
	c, err := cluster.Up(upCtx, cluster.Options{Nodes: f.nodes, StateDir: f.stateDir, BinDir: f.binDir, KubeBinDir: f.kubeBinDir})
	if err != nil {
		return fmt.Errorf("cluster up: %w", err)
	}
	say("cluster up in %s; kubeconfig %s", time.Since(start).Round(time.Second), c.Kubeconfig)
	s, err := stack.New(c.Config, c.Kubeconfig, f.helm, cluster.ServiceCIDR)
	if err != nil {
		return err
	}
	start = time.Now()
	say("helm upgrade --install sockscale charts/sockscale -n %s (stable window 20s for a short demo)", stack.Namespace)
	if err := s.Install(upCtx, "autoscaler.stable-window=20s"); err != nil {
		return err
	}
	say("chart installed in %s", time.Since(start).Round(time.Second))
	say("deploying %s/%s: the autoscale app, its public Service and a PodAutoscaler (target 10 per pod at 70%%, min 1, max 10)", appNS, appName)
	if err := s.Deploy(ctx, stack.App{Namespace: appNS, Name: appName, Spec: func(p *v1alpha1.PodAutoscalerSpec) {
		p.Target, p.MinScale, p.MaxScale, p.TargetBurstCapacity = ptr(10.0), ptr(int32(1)), ptr(int32(10)), ptr(0.0)
	}}); err != nil { // Up started a fresh cluster: nothing of the app exists yet
		return err
	}
	url, err := waitReady(ctx, s)
	if err != nil {
		return err
	}

	samples, completed, failed, err := ramp(ctx, s, f, url, w)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(f.out), 0o755); err != nil {
		return err
	}
	out, err := os.Create(f.out)
	if err != nil {
		return err
	}
	if err := WritePNG(out, fmt.Sprintf("sockscale demo: %s/%s, target 7 in flight per pod", appNS, appName), samples); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	say("%d requests, %d failed; timeline plot: %s", completed, failed, f.out)
	agents, _ := s.AgentMetrics(ctx)
	fmt.Fprintf(w, `
Look around (the cluster keeps running):
  export KUBECONFIG=%s
  %s get pa,sks -A                # mode, desired/actual pods, stable concurrency, panic
  %s get pods -A -o wide
  %s get endpointslices -n %s     # the public Service's endpoints, written by sockscale
`, c.Kubeconfig, kubectl(f), kubectl(f), kubectl(f), appNS)
	if ip := agentIP(ctx, s); ip != "" {
		fmt.Fprintf(w, "  curl -s http://%s:9090/metrics | grep sockscale_agent_requests   # a node's agent (%d pods accounted)\n", ip, len(agents))
	}
	fmt.Fprintf(w, "  logs: %s\nTear down: make cluster-down\n", c.LogDir())
	return nil
}

func kubectl(f *flags) string { return filepath.Join(f.kubeBinDir, "kubectl") }

func agentIP(ctx context.Context, s *stack.Stack) string {
	ip, err := s.AgentIP(ctx)
	if err != nil {
		return ""
	}
	return ip
}

// waitReady waits for the app's first ready pod and returns its public URL.
func waitReady(ctx context.Context, s *stack.Stack) (string, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		d, err := s.Deployment(ctx, appNS, appName)
		if err == nil && d.Status.ReadyReplicas > 0 {
			return s.PublicURL(ctx, appNS, appName)
		}
		if time.Now().After(deadline) {
			if err != nil {
				return "", fmt.Errorf("%s/%s has no ready pod after 2 minutes: %w", appNS, appName, err)
			}
			return "", fmt.Errorf("%s/%s has no ready pod after 2 minutes", appNS, appName)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// ramp runs the load steps and prints a table row every 2 s.
func ramp(ctx context.Context, s *stack.Stack, f *flags, url string, w io.Writer) ([]Sample, int64, int64, error) {
	const row = "%6s %8s %9s %8s %6s %6s %6s\n"
	fmt.Fprintf(w, row, "time", "offered", "observed", "desired", "ready", "mode", "panic")
	var (
		loads             []*loadgen.Load
		samples           []Sample
		completed, failed int64
	)
	stopAll := func() {
		for _, l := range loads {
			r := l.Stop()
			completed, failed = completed+r.Completed, failed+r.Failed
		}
		loads = nil
	}
	defer stopAll()
	begin := time.Now()
	for _, offered := range f.ramp {
		// Each step starts afresh: the clients of the last step stop and
		// this step's start (a handler sleeping 200 ms per request).
		stopAll()
		if offered > 0 {
			loads = append(loads, loadgen.Start(ctx, loadgen.Options{URLs: []string{url + "?sleep=200"}, Concurrency: offered, KeepAlive: true}))
		}
		for stepEnd := time.Now().Add(f.step); time.Now().Before(stepEnd); {
			select {
			case <-ctx.Done():
				return samples, completed, failed, ctx.Err()
			case <-time.After(2 * time.Second):
			}
			sm := Sample{At: time.Since(begin), Offered: float64(offered)}
			if pa, err := s.PA(ctx, appNS, appName); err == nil {
				sm.Observed, _ = strconv.ParseFloat(pa.Status.StableValue, 64)
				if pa.Status.DesiredScale != nil {
					sm.Desired = *pa.Status.DesiredScale
				}
				sm.Mode, sm.Panicking = string(pa.Status.Mode), pa.Status.Panicking
			}
			if d, err := s.Deployment(ctx, appNS, appName); err == nil {
				sm.Ready = d.Status.ReadyReplicas
			}
			samples = append(samples, sm)
			fmt.Fprintf(w, row, fmt.Sprintf("%ds", int(sm.At.Seconds())), strconv.Itoa(offered), strconv.FormatFloat(sm.Observed, 'f', 1, 64),
				strconv.Itoa(int(sm.Desired)), strconv.Itoa(int(sm.Ready)), sm.Mode, strconv.FormatBool(sm.Panicking))
		}
	}
	stopAll()
	return samples, completed, failed, nil
}

func ptr[T any](v T) *T { return &v }
