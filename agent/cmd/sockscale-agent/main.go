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
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"

	"github.com/sockscale/sockscale/agent/internal/connaudit"
	"github.com/sockscale/sockscale/agent/internal/drain"
	"github.com/sockscale/sockscale/agent/internal/endpointwatch"
	"github.com/sockscale/sockscale/agent/internal/lifecycle"
	"github.com/sockscale/sockscale/agent/internal/metrics"
	"github.com/sockscale/sockscale/agent/internal/nodeaddr"
	"github.com/sockscale/sockscale/agent/internal/podwatch"
	"github.com/sockscale/sockscale/agent/internal/preflight"
	agentredirect "github.com/sockscale/sockscale/agent/internal/redirect"
	"github.com/sockscale/sockscale/agent/internal/sampler"
	"github.com/sockscale/sockscale/bpf"
	"github.com/sockscale/sockscale/internal/logflags"
	"github.com/sockscale/sockscale/internal/securemetrics"
	"github.com/sockscale/sockscale/internal/serve"
	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/internal/stats/report"
)

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sockscale-agent:", err)
		os.Exit(2)
	}
	level, _ := logflags.ParseLevel(cfg.logLevel)
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

// With --metrics-secure every scrape's token and permission are asked of
// the API server (cached a minute for tokens, five for allowed requests).
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

func run(ctx context.Context, cfg *config, log *slog.Logger) error {
	if cfg.uninstall {
		return uninstall(cfg.bpffsDir, log)
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
		if err := uninstall(cfg.bpffsDir, log); err != nil {
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
	agentMetrics := metrics.New(reg)

	redir, offState, err := agentredirect.LoadKernelRedirect(cfg.redirectLoadOptions(log))
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
			Required:     cfg.socketRedirect == agentredirect.ModeOn,
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
	smp := sampler.New(acct, pods, sampler.Options{
		Node: cfg.nodeName, Period: cfg.reportPeriod, Clock: clock.RealClock{}, Log: log,
		Recorder: agentMetrics, OnSample: onSample,
	})
	metrics.RegisterSamples(reg, smp.Latest, pods.Status)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 8)
	if cfg.auditPeriod > 0 {
		// Each pod's connection count against the kernel's socket table:
		// every period, and a pod as soon as it is added (its idle
		// connections from before are counted at once).
		auditor := connaudit.New(acct, pods, connaudit.Options{Period: cfg.auditPeriod, Log: log.With("part", "connaudit"), Registerer: reg})
		pods.OnAdded(auditor.Poke)
		go auditor.Run(ctx)
	}
	go func() { errc <- pods.Run(ctx, client, cfg.nodeName, clock.RealClock{}) }()
	if cfg.activatorSelector != "" {
		refusals, stopEvents, err := activatorRefusals(ctx, client, cfg)
		if err != nil {
			return err
		}
		defer stopEvents()
		go func() {
			errc <- podwatch.WatchActivators(ctx, client, cfg.activatorNamespace, cfg.activatorSelector, acct, reg, refusals, log)
		}()
	}
	if redirects != nil {
		go func() { errc <- redirects.Run(ctx) }()
	}
	// The node's own addresses, which the kernel needs to tell the
	// kubelet's probes from requests that only carry its User-Agent.
	if cfg.probeSources == probeSourcesAny {
		log.Warn("--probe-sources=any: a probe's User-Agent is believed from every client, so a pod can hide its load behind it")
		if err := acct.SetNodeAddrs([]netip.Addr{netip.IPv4Unspecified()}); err != nil {
			return err
		}
	} else {
		go func() {
			errc <- nodeaddr.Run(ctx, nodeaddr.Options{
				Netns: cfg.nodeNetns, Set: acct.SetNodeAddrs, Log: log.With("part", "nodeaddr"),
				OnError: func(error) { agentMetrics.Error("node_addresses") },
			})
		}()
	}
	if cfg.drainAddr != "" {
		// Leaving pods: their clients moved off kept-alive connections and
		// their requests finished before the kubelet stops them (the
		// preStop hooks of serving Revisions wait here).
		endpoints := endpointwatch.New(nil)
		go func() { errc <- endpoints.Run(ctx, client, cfg.nodeName) }()
		drainer := drain.New(acct, pods, drain.Sockets{}, drain.Options{
			MinWait: cfg.drainMinWait, Endpoints: endpoints, Log: log.With("part", "drain"), Registerer: reg,
			Deleting: func(ctx context.Context, namespace, workload string) ([]types.UID, error) {
				return podwatch.DeletingPods(ctx, client, cfg.nodeName, namespace, workload)
			},
		})
		mux := http.NewServeMux()
		mux.Handle("/drain", drainer.Handler())
		go drainer.Run(ctx)
		// A namespace it cannot open (or a port another holds) stops only
		// the wait, not the accounting: it is tried again every 10 s, like
		// the node's addresses, and said each time.
		go func() {
			for {
				ln, err := drain.ListenIn(cfg.nodeNetns, cfg.drainAddr)
				if err == nil {
					errc <- serve.On(ctx, ln, serve.New(cfg.drainAddr, mux))
					return
				}
				agentMetrics.Error("drain_listen")
				log.Error("the preStop wait cannot listen; leaving pods are not held until drained", "address", cfg.drainAddr, "netns", cfg.nodeNetns, "error", err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(10 * time.Second):
				}
			}
		}()
	}
	go smp.Run(ctx)
	go owner.Run(ctx)
	if reporter != nil {
		go reporter.Run(ctx)
	}
	go func() {
		errc <- securemetrics.Serve(ctx, cfg.metrics, restCfg, metricsMux(reg), logr.FromSlogHandler(log.With("part", "metrics").Handler()))
	}()
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

// activatorRefusals is where WatchActivators records the kernel's
// refusals of the activator set: Events on the agent's own pod, through a
// broadcaster that stop flushes and ends. They are created in the agent's
// own namespace only, which a Role of the chart allows (agent-rbac.yaml,
// not a marker: markers make ClusterRole rules). Without --pod-name and
// --pod-namespace (an agent run by hand) there is no pod to record on:
// nil, and the log and metrics alone say it.
func activatorRefusals(ctx context.Context, client kubernetes.Interface, cfg *config) (*podwatch.RefusalEvents, func(), error) {
	if cfg.podName == "" || cfg.podNamespace == "" {
		return nil, func() {}, nil
	}
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	if err := b.StartRecordingToSinkWithContext(ctx); err != nil {
		return nil, nil, fmt.Errorf("events: %w", err)
	}
	return &podwatch.RefusalEvents{
		Recorder: b.NewRecorder(scheme.Scheme, "sockscale-agent"),
		Limit:    bpf.MaxActivators,
		Regarding: func() runtime.Object {
			// kubectl describe matches Events by the pod's UID too.
			ref := &corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: cfg.podNamespace, Name: cfg.podName}
			if pod, err := client.CoreV1().Pods(cfg.podNamespace).Get(ctx, cfg.podName, metav1.GetOptions{}); err == nil {
				ref.UID = pod.UID
			}
			return ref
		},
	}, b.Shutdown, nil
}

// decideTimeout bounds the read of the DaemonSet at exit, well inside the
// chart's terminationGracePeriodSeconds (30 s).
const decideTimeout = 5 * time.Second

// uninstall removes the agent's kernel state (bpf.UninstallAll) and says so.
func uninstall(bpffsDir string, log *slog.Logger) error {
	if err := bpf.UninstallAll(bpffsDir); err != nil {
		return err
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
