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

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/test/cluster"
	"github.com/sockscale/sockscale/test/stack"
)

type flags struct {
	stateDir, kubeBinDir, helm, out string
	nodes                           int
	ramp                            []int
	step                            time.Duration
	burst                           int
	after                           time.Duration
	rollout                         bool
	rolloutOut                      string
}

func parseFlags(args []string) (*flags, error) {
	f := &flags{}
	fs := flag.NewFlagSet("sockscale-demo", flag.ContinueOnError)
	fs.StringVar(&f.stateDir, "state-dir", cluster.DefaultStateDir(), "the local cluster's state directory")
	fs.StringVar(&f.kubeBinDir, "kube-bin-dir", cluster.DefaultKubeBinDir(), "the control plane's binaries (make cluster-binaries)")
	fs.StringVar(&f.helm, "helm", stack.HelmFromEnv(), "helm binary (default $HELM)")
	fs.StringVar(&f.out, "out", "out/demo.png", "where the timeline plot is written")
	fs.IntVar(&f.nodes, "nodes", 2, "simulated nodes")
	ramp := fs.String("ramp", "5,14,28,42,28,7", "offered concurrency of each step (comma-separated); then no load until the app is at zero")
	fs.DurationVar(&f.step, "step", 20*time.Second, "how long each step of the ramp lasts")
	fs.IntVar(&f.burst, "burst", 20, "requests sent at once when the app is at zero (a cold start)")
	fs.DurationVar(&f.after, "after", 20*time.Second, "how long the table goes on after the requests at zero")
	fs.BoolVar(&f.rollout, "rollout", true, "then a serving Service's gradual rollout from v1 to v2 under load from in-node clients (--rollout=false skips it)")
	fs.StringVar(&f.rolloutOut, "rollout-out", "", "where the rollout plot is written (default: --out with -rollout before .png)")
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
	if f.burst < 1 || f.burst > 1000 {
		errs = append(errs, fmt.Errorf("--burst=%d: want 1 to 1000 requests", f.burst))
	}
	if f.after < 4*time.Second || f.after > 10*time.Minute {
		errs = append(errs, fmt.Errorf("--after=%s: want 4s to 10m", f.after))
	}
	if f.helm == "" {
		errs = append(errs, errors.New("--helm: no helm binary (make demo builds the pinned one and sets $HELM)"))
	}
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if f.rolloutOut == "" {
		f.rolloutOut = strings.TrimSuffix(f.out, filepath.Ext(f.out)) + "-rollout.png"
	}
	return f, errors.Join(errs...)
}

func main() {
	// The rollout scene runs this binary again as its in-node clients.
	if cfg := os.Getenv(clientEnv); cfg != "" {
		if err := runClient(cfg, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "sockscale-demo client:", err)
			os.Exit(1)
		}
		return
	}
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
	c, err := cluster.Up(upCtx, cluster.Options{Nodes: f.nodes, StateDir: f.stateDir, KubeBinDir: f.kubeBinDir})
	if err != nil {
		return fmt.Errorf("cluster up: %w", err)
	}
	say("cluster up in %s; kubeconfig %s", time.Since(start).Round(time.Second), c.Kubeconfig)
	s, err := stack.New(c.Config, c.Kubeconfig, f.helm, cluster.ServiceCIDR)
	if err != nil {
		return err
	}
	start = time.Now()
	say("make images push REGISTRY=%s; helm package and push to oci://%s", stack.ImageRepo, stack.ChartRepo)
	if err := stack.PushImages(upCtx); err != nil {
		return err
	}
	if err := s.PushChart(upCtx); err != nil {
		return err
	}
	say("images and chart pushed in %s", time.Since(start).Round(time.Second))
	start = time.Now()
	say("helm upgrade --install sockscale oci://%s/sockscale --plain-http -n %s (stable window 20s for a short demo)", stack.ChartRepo, stack.Namespace)
	if err := s.Install(upCtx, "autoscaler.stable-window=20s"); err != nil {
		return err
	}
	say("chart installed in %s", time.Since(start).Round(time.Second))
	wc, err := client.NewWithWatch(c.Config, client.Options{Scheme: s.Client.Scheme()})
	if err != nil {
		return err
	}

	// A scene that fails says why; the plots get what was measured, and
	// the next scene still runs (unless the demo was interrupted).
	var failed []error
	tl := &timeline{s: s, act: newActivators(s, appNS, appName), w: w}
	done, err := autoscaleScenes(ctx, s, wc, f, tl, say)
	if err != nil {
		failed = append(failed, fmt.Errorf("autoscale scenes: %w", err))
		say("the autoscale scenes stopped: %v", err)
	}
	title := fmt.Sprintf("sockscale demo: %s/%s, target 7 in flight per pod, min 0: a ramp, idle to zero, %d requests at zero", appNS, appName, f.burst)
	if err := writePlot(f.out, func(out io.Writer) error { return WritePNG(out, title, tl.samples, tl.markers) }); err != nil {
		failed = append(failed, err)
	} else {
		say("%stimeline plot: %s", done, f.out)
	}

	if f.rollout && ctx.Err() == nil {
		say("rollout scene: a serving Service, a template change, traffic moved over %s (%s)", rolloutDuration, servingv1alpha1.RolloutDurationAnnotation)
		rec, err := runRollout(ctx, s, wc, w)
		if err != nil {
			failed = append(failed, fmt.Errorf("rollout scene: %w", err))
			say("the rollout scene stopped: %v", err)
		}
		title := fmt.Sprintf("sockscale demo: %s/%s from %s to %s, rollout-duration %s, %d in-node clients, a new connection every %s each",
			appNS, rolloutSvc, rec.V1, rec.V2, rolloutDuration, f.nodes, clientEvery)
		if err := writePlot(f.rolloutOut, func(out io.Writer) error { return WriteRolloutPNG(out, title, rec) }); err != nil {
			failed = append(failed, err)
		} else {
			say("rollout plot: %s (%s's scheduled percent as a step line, its measured share of each second's new connections as dots; ready pods of each revision below)", f.rolloutOut, rec.V2)
		}
	}

	agents, _ := s.AgentMetrics(ctx)
	fmt.Fprintf(w, `
Look around (the cluster keeps running):
  export KUBECONFIG=%s
  %s get pa,sks -A                # mode, desired/actual pods, stable concurrency, panic
  %s get pods -A -o wide
  %s get endpointslices -n %s     # the public Service's endpoints, written by sockscale
`, c.Kubeconfig, kubectl(f), kubectl(f), kubectl(f), appNS)
	if f.rollout {
		fmt.Fprintf(w, "  %s get ssvc,ssrt,ssrev -n %s        # the serving Service, its Route's split, its Revisions\n", kubectl(f), appNS)
	}
	if ip := agentIP(ctx, s); ip != "" {
		// The agents' /metrics take a token with the chart's
		// metrics-reader ClusterRole: the harness scraper's.
		fmt.Fprintf(w, "  TOKEN=$(%s create token %s -n %s)   # bound to %s\n", kubectl(f), stack.ScraperName, stack.ScraperNamespace, stack.MetricsReaderRole)
		fmt.Fprintf(w, "  curl -sk -H \"Authorization: Bearer $TOKEN\" https://%s:%d/metrics | grep sockscale_agent_requests   # a node's agent (%d pods accounted)\n",
			ip, stack.AgentMetricsPort, len(agents))
	}
	fmt.Fprintf(w, "  logs: %s\nTear down: make cluster-down\n", c.LogDir())
	return errors.Join(failed...)
}

// autoscaleScenes deploys the autoscaled app and runs the load ramp, the
// idle app going to zero and the requests at zero, the table's rows kept
// in tl for the plot; it returns what the load did, for the last line.
func autoscaleScenes(ctx context.Context, s *stack.Stack, wc client.WithWatch, f *flags, tl *timeline, say func(string, ...any)) (string, error) {
	say("deploying %s/%s: the autoscale app, its public Service and a PodAutoscaler (target 10 per pod at 70%%, min 0, max 10, stable window 10s, burst capacity 0: the activator is in the path only at zero)", appNS, appName)
	if err := s.Deploy(ctx, stack.App{Namespace: appNS, Name: appName, Spec: func(p *v1alpha1.PodAutoscalerSpec) {
		p.Target, p.MinScale, p.MaxScale, p.TargetBurstCapacity = ptr.To(10.0), ptr.To(int32(0)), ptr.To(int32(10)), ptr.To(0.0)
		p.Window = &metav1.Duration{Duration: 10 * time.Second}
	}}); err != nil { // Up started a fresh cluster: nothing of the app exists yet
		return "", err
	}
	url, err := waitReady(ctx, s)
	if err != nil {
		return "", err
	}
	tl.begin = time.Now()
	tl.header()
	completed, failed, err := tl.ramp(ctx, f, url)
	ramp := fmt.Sprintf("ramp: %d requests, %d failed; ", completed, failed)
	if err != nil {
		return ramp, err
	}
	bd, err := tl.coldStart(ctx, wc, f, url)
	if err != nil {
		return ramp, err
	}
	bd.write(tl.w)
	return ramp + fmt.Sprintf("at zero: %d sent, %d answered 200; ", f.burst, len(bd.burst.latencies)), nil
}

// writePlot creates path (and its directory) and draws into it.
func writePlot(path string, draw func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := draw(out); err != nil {
		out.Close()
		return fmt.Errorf("draw %s: %w", path, err)
	}
	return out.Close()
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
