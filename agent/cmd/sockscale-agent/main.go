// Command sockscale-agent is the per-node agent: it loads the request
// accounting programs, keeps their pod map equal to the node's pods, serves
// the node's /metrics and reports per-pod stats to the controller; it also
// keeps the kernel's connect-time redirect map equal to the
// ServerlessServices in Proxy mode and the Routes' traffic splits.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"

	"github.com/sockscale/sockscale/agent/internal/lifecycle"
	"github.com/sockscale/sockscale/agent/internal/metrics"
	"github.com/sockscale/sockscale/agent/internal/podwatch"
	"github.com/sockscale/sockscale/agent/internal/preflight"
	agentredirect "github.com/sockscale/sockscale/agent/internal/redirect"
	"github.com/sockscale/sockscale/agent/internal/sampler"
	"github.com/sockscale/sockscale/bpf"
	"github.com/sockscale/sockscale/bpf/redirect"
	"github.com/sockscale/sockscale/internal/serve"
	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/internal/stats/report"
)

type config struct {
	nodeName           string
	podName            string
	podNamespace       string
	cgroupRoot         string
	bpffsDir           string
	kubeconfig         string
	metricsAddr        string
	healthAddr         string
	reportPeriod       time.Duration
	controllerStats    string
	tokenFile          string
	caFile             string
	activatorSelector  string
	activatorNamespace string
	activatorPort      int
	socketRedirect     string
	logLevel           string
	uninstall          bool
	// redirectRetryBackoff and redirectSyncTimeout have no flags: tests
	// shorten them (0 means the redirect package's defaults).
	redirectRetryBackoff time.Duration
	redirectSyncTimeout  time.Duration
}

func parseFlags(args []string) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("sockscale-agent", flag.ContinueOnError)
	fs.StringVar(&c.nodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default: $NODE_NAME)")
	fs.StringVar(&c.podName, "pod-name", os.Getenv("POD_NAME"), "this agent's pod (default: $POD_NAME); with --pod-namespace it finds the owning DaemonSet, whose deletion makes a stop an uninstall")
	fs.StringVar(&c.podNamespace, "pod-namespace", os.Getenv("POD_NAMESPACE"), "this agent's namespace (default: $POD_NAMESPACE)")
	fs.StringVar(&c.cgroupRoot, "cgroup-root", "/sys/fs/cgroup", "cgroup v2 directory to attach at; every pod's cgroup must be below it")
	fs.StringVar(&c.bpffsDir, "bpffs-dir", "/sys/fs/bpf/sockscale", "directory on a bpffs where maps and links are pinned (survive restarts)")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster config)")
	fs.StringVar(&c.metricsAddr, "metrics-bind-address", ":9090", "address of the /metrics endpoint")
	fs.StringVar(&c.healthAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	fs.DurationVar(&c.reportPeriod, "report-period", time.Second, "how often counters are read and reported (100ms..1m)")
	fs.StringVar(&c.controllerStats, "controller-stats-address", "", "host:port of the controller's stats Service (headless: every replica gets the stats); empty: do not report")
	fs.StringVar(&c.caFile, "controller-ca-file", "", "PEM CA that signs the controller's stats serving certificate: report over HTTPS, verifying the Service's name (reloaded when the file changes); empty: plain HTTP")
	fs.StringVar(&c.tokenFile, "controller-token-file", "", "file with this pod's projected ServiceAccount token for the controller (audience sockscale-controller), read again for every batch as the kubelet rotates it; empty: send no token (only a controller with --stats-insecure-skip-auth takes that)")
	fs.StringVar(&c.activatorSelector, "activator-selector", "app.kubernetes.io/component=activator", "label selector of activator pods: their requests count as proxied; empty: none")
	fs.StringVar(&c.activatorNamespace, "activator-namespace", "", "namespace of the activator pods (default: all namespaces)")
	fs.IntVar(&c.activatorPort, "activator-port", 8012, "port on which activators take proxied requests (the controller's --activator-port)")
	fs.StringVar(&c.socketRedirect, "socket-redirect", redirectAuto, "send new connects to a public Service in Proxy mode straight to its activators, in the kernel: auto (where the kernel can), on (fail if it cannot), off (kube-proxy's path only)")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&c.uninstall, "uninstall", false, "detach the programs, remove everything pinned under --bpffs-dir, and exit (a running agent does this itself when it stops because its DaemonSet was deleted)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q: sockscale-agent takes flags only", fs.Args())
	}
	return c, c.validate()
}

func (c *config) validate() error {
	var errs []error
	if !c.uninstall && c.nodeName == "" {
		errs = append(errs, errors.New("--node-name is empty: set it or $NODE_NAME (the chart sets it from spec.nodeName)"))
	}
	if c.reportPeriod < 100*time.Millisecond || c.reportPeriod > time.Minute {
		errs = append(errs, fmt.Errorf("--report-period=%v: must be between 100ms and 1m", c.reportPeriod))
	}
	if c.bpffsDir == "" || c.bpffsDir == "/" {
		errs = append(errs, fmt.Errorf("--bpffs-dir=%q: must be a directory of its own on a bpffs, e.g. /sys/fs/bpf/sockscale", c.bpffsDir))
	}
	for flagName, addr := range map[string]string{"--metrics-bind-address": c.metricsAddr, "--health-probe-bind-address": c.healthAddr} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: want [host]:port, e.g. :9090", flagName, addr))
		}
	}
	if c.controllerStats != "" {
		if _, _, err := net.SplitHostPort(c.controllerStats); err != nil {
			errs = append(errs, fmt.Errorf("--controller-stats-address=%q: want host:port", c.controllerStats))
		}
	}
	switch c.socketRedirect {
	case redirectAuto, redirectOn, redirectOff:
	default:
		errs = append(errs, fmt.Errorf("--socket-redirect=%q: want auto, on or off", c.socketRedirect))
	}
	if c.activatorPort < 1 || c.activatorPort > 65535 {
		errs = append(errs, fmt.Errorf("--activator-port=%d: want 1..65535", c.activatorPort))
	}
	if c.socketRedirect == redirectOn && c.activatorSelector == "" {
		errs = append(errs, errors.New("--socket-redirect=on needs --activator-selector: the activator pods are the redirect's destinations"))
	}
	if _, err := labels.Parse(c.activatorSelector); err != nil {
		errs = append(errs, fmt.Errorf("--activator-selector=%q: %w", c.activatorSelector, err))
	}
	if _, err := parseLevel(c.logLevel); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Values of --socket-redirect.
const (
	redirectAuto = "auto"
	redirectOn   = "on"
	redirectOff  = "off"
)

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level=%q: want debug, info, warn or error", s)
	}
	return l, nil
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sockscale-agent:", err)
		os.Exit(2)
	}
	level, _ := parseLevel(cfg.logLevel)
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("component", "agent", "node", cfg.nodeName)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("agent failed", "err", err)
		os.Exit(1)
	}
}

// The controller's stats endpoint asks the API server whether the agent
// may "create" nodestats.sockscale.dev, a virtual resource that nothing
// serves: that permission is what lets it report its node.
// +kubebuilder:rbac:groups=sockscale.dev,resources=nodestats,verbs=create

func run(ctx context.Context, cfg *config, log *slog.Logger) error {
	if cfg.uninstall {
		return removeKernelState(cfg.bpffsDir, log)
	}
	if err := preflightChecks(cfg); err != nil {
		return err
	}
	restCfg, err := restConfig(cfg.kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	// Registered first, so it runs last: after the accounting and the
	// redirect closed their file descriptors, which hold the links too.
	owner := lifecycle.NewWatcher(client, cfg.podNamespace, cfg.podName, log)
	var atExit lifecycle.Decision
	defer func() {
		if !atExit.Uninstall {
			return
		}
		if err := removeKernelState(cfg.bpffsDir, log); err != nil {
			log.Error("uninstall at exit", "err", err)
		}
	}()
	acct, err := bpf.New(bpf.Options{CgroupRoot: cfg.cgroupRoot, PinDir: cfg.bpffsDir})
	if err != nil {
		return err
	}
	// Closing keeps the pinned programs attached and counting: a restarted
	// agent carries on. An uninstall (atExit) or --uninstall removes them.
	defer func() {
		if err := acct.Close(); err != nil {
			log.Error("release accounting", "err", err)
		}
	}()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	pods := podwatch.New(acct, log)
	var smp *sampler.Sampler
	agentMetrics := metrics.New(reg, func() *sampler.Sample { return smp.Latest() }, pods.Status)

	redir, offState, err := loadRedirect(cfg, log)
	if err != nil {
		return err
	}
	// Closing keeps the pinned entries redirecting: a restarted agent
	// resyncs them.
	defer func() {
		if err := redir.Close(); err != nil {
			log.Error("release redirect", "err", err)
		}
	}()
	var redirects *agentredirect.Reconciler
	if redir != nil {
		sel, _ := labels.Parse(cfg.activatorSelector) // validated with the flags
		redirects, err = agentredirect.New(restCfg, agentredirect.Options{
			Map: redir, ActivatorNamespace: cfg.activatorNamespace, ActivatorSelector: sel,
			ActivatorPort: uint16(cfg.activatorPort), Log: log, Registerer: reg,
			Required:     cfg.socketRedirect == redirectOn,
			RetryBackoff: cfg.redirectRetryBackoff, SyncTimeout: cfg.redirectSyncTimeout,
		})
		if err != nil {
			return err
		}
	}
	// nodeState is sent beside every batch, for the controller's
	// SocketLayer condition on each ServerlessService.
	nodeState := func() stats.NodeState { return offState }
	if redirects != nil {
		nodeState = redirects.State
	}
	agentredirect.RegisterStateMetric(reg, nodeState)

	var reporter *report.Reporter
	var onSample func(*sampler.Sample)
	if cfg.controllerStats != "" {
		reporter, err = report.New(cfg.controllerStats, cfg.reportPeriod, agentMetrics, log)
		if err != nil {
			return err
		}
		reporter.SetTokenFile(cfg.tokenFile)
		if cfg.caFile != "" {
			if err := reporter.SetCAFile(cfg.caFile); err != nil {
				return fmt.Errorf("--controller-ca-file: %w", err)
			}
		}
		onSample = func(s *sampler.Sample) {
			if s.Batch != nil {
				ns := nodeState()
				s.Batch.NodeState = &ns
				reporter.Offer(s.Batch)
			}
		}
	}
	smp = sampler.New(acct, pods, sampler.Options{
		Node: cfg.nodeName, Period: cfg.reportPeriod, Clock: clock.RealClock{}, Log: log,
		Recorder: agentMetrics, OnSample: onSample,
	})

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 5)
	go func() { errc <- pods.Run(ctx, client, cfg.nodeName, clock.RealClock{}) }()
	if cfg.activatorSelector != "" {
		go func() {
			errc <- podwatch.WatchActivators(ctx, client, cfg.activatorNamespace, cfg.activatorSelector, acct, log)
		}()
	}
	if redirects != nil {
		go func() { errc <- redirects.Run(ctx) }()
	}
	go smp.Run(ctx)
	go owner.Run(ctx)
	if reporter != nil {
		go reporter.Run(ctx)
	}
	go func() { errc <- serve.Serve(ctx, cfg.metricsAddr, metricsMux(reg)) }()
	go func() { errc <- serve.Serve(ctx, cfg.healthAddr, healthMux(pods, smp)) }()
	log.Info("agent started", "cgroupRoot", cfg.cgroupRoot, "bpffsDir", cfg.bpffsDir, "reportPeriod", cfg.reportPeriod, "socketRedirect", redir != nil)

	select {
	case <-ctx.Done():
		// Told to stop: a restart keeps the kernel state, an uninstall
		// removes it (lifecycle says which and why). The run's ctx has
		// ended; the read gets a few seconds of the grace period.
		dctx, dcancel := context.WithTimeout(context.Background(), decideTimeout)
		defer dcancel()
		atExit = owner.Decide(dctx)
		log.Info("stopping", "kernelState", atExit.Reason)
		return nil
	case err := <-errc:
		// A failure is never an uninstall: the next agent adopts the state.
		return err
	}
}

// decideTimeout bounds the read of the DaemonSet at exit, well inside the
// chart's terminationGracePeriodSeconds (30 s).
const decideTimeout = 5 * time.Second

// removeKernelState detaches every program the agent attached (the
// accounting's and the socket-layer redirect's) and removes every pin and
// the pin directory.
func removeKernelState(bpffsDir string, log *slog.Logger) error {
	// The redirect first: it leaves the directory when the accounting's
	// pins are still in it; the accounting's Uninstall removes the rest.
	if err := redirect.Uninstall(bpffsDir); err != nil {
		return fmt.Errorf("uninstall socket-layer redirect: %w", err)
	}
	if err := bpf.Uninstall(bpffsDir); err != nil {
		return fmt.Errorf("uninstall accounting: %w", err)
	}
	log.Info("uninstalled: programs detached and pins removed", "dir", bpffsDir)
	return nil
}

func preflightChecks(cfg *config) error {
	if err := preflight.CheckCgroupRoot(cfg.cgroupRoot); err != nil {
		return err
	}
	if err := preflight.EnsureBPFFS(cfg.bpffsDir); err != nil {
		return err
	}
	if err := preflight.CheckPermission(); err != nil {
		return err
	}
	return preflight.CheckKernel()
}

// loadRedirect loads the connect-time redirect at the accounting's cgroup
// root, pinned beside it, as --socket-redirect says; nil when it is off,
// with the node state that says why.
// Off (or unavailable with auto) removes a redirect an earlier agent
// pinned: nobody would keep its entries up to date.
func loadRedirect(cfg *config, log *slog.Logger) (*redirect.Redirect, stats.NodeState, error) {
	mode := cfg.socketRedirect
	off := stats.NodeState{SocketRedirect: stats.RedirectOff, Reason: "--socket-redirect=off"}
	if mode == redirectAuto && cfg.activatorSelector == "" {
		log.Warn("socket-layer redirect off: --activator-selector is empty, so the activators cannot be found")
		mode = redirectOff
		off.Reason = "--activator-selector is empty: the activators cannot be found"
	}
	if mode != redirectOff {
		r, err := redirect.New(redirect.Options{CgroupRoot: cfg.cgroupRoot, PinDir: cfg.bpffsDir, Lease: agentredirect.LeaseTTL})
		if err == nil {
			return r, stats.NodeState{}, nil
		}
		if mode == redirectOn {
			return nil, stats.NodeState{}, fmt.Errorf("--socket-redirect=on: %w", err)
		}
		log.Warn("socket-layer redirect off: this kernel cannot load it; Proxy mode goes through the public EndpointSlices (kube-proxy) only. --socket-redirect=on makes this fatal", "err", err)
		off = stats.NodeState{SocketRedirect: stats.RedirectUnavailable, Reason: err.Error()}
	}
	if err := redirect.Uninstall(cfg.bpffsDir); err != nil {
		return nil, stats.NodeState{}, fmt.Errorf("remove the pinned socket-layer redirect (--socket-redirect=%s): %w", cfg.socketRedirect, err)
	}
	return nil, off, nil
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	rc.UserAgent = "sockscale-agent"
	return rc, nil
}

func metricsMux(reg *prometheus.Registry) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return mux
}

// healthMux: alive while serving; ready once the pod map is in sync and the
// counters have been read.
func healthMux(pods *podwatch.Watcher, smp *sampler.Sampler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case !pods.Status().Synced:
			http.Error(w, "pod list not synced yet", http.StatusServiceUnavailable)
		case smp.Latest() == nil:
			http.Error(w, "kernel counters not read yet", http.StatusServiceUnavailable)
		default:
			_, _ = w.Write([]byte("ok"))
		}
	})
	return mux
}
