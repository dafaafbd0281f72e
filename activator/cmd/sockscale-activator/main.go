// Command sockscale-activator holds requests for targets that have no
// ready pod, wakes them, and forwards to their pods without exceeding
// containerConcurrency.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/sockscale/sockscale/activator/internal/cachetrim"
	"github.com/sockscale/sockscale/activator/internal/handler"
	"github.com/sockscale/sockscale/activator/internal/holdpool"
	"github.com/sockscale/sockscale/activator/internal/netpol"
	"github.com/sockscale/sockscale/activator/internal/readiness"
	"github.com/sockscale/sockscale/activator/internal/resolve"
	"github.com/sockscale/sockscale/activator/internal/stats"
	"github.com/sockscale/sockscale/activator/internal/target"
	"github.com/sockscale/sockscale/activator/internal/throttle"
	"github.com/sockscale/sockscale/activator/internal/watch"
	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/internal/logflags"
	"github.com/sockscale/sockscale/internal/memlimit"
	"github.com/sockscale/sockscale/internal/securemetrics"
	"github.com/sockscale/sockscale/internal/serve"
	statsreport "github.com/sockscale/sockscale/internal/stats/report"
)

// maxQueueDepth bounds --queue-depth: a held request costs ~17 KB of RSS
// (make bench: its connection's buffers and two goroutines), so the
// default 10,000 per target is ~170 MB and a million would be ~17 GB. A
// target's spec.activator.queueDepth has the same bound.
const maxQueueDepth = v1alpha1.MaxQueueDepth

// maxMaxHeld bounds --max-held: at holdpool.RequestCost (96 KiB) a
// request, a million held would want ~100 GB.
const maxMaxHeld = 1_000_000

// The cgroup v2 files the memory limit is read from.
const (
	cgroupFS   = "/sys/fs/cgroup"
	selfCgroup = "/proc/self/cgroup"
)

type config struct {
	podName       string
	podIP         string
	metricsAddr   string
	metrics       securemetrics.Config
	healthAddr    string
	proxyAddr     string
	routeAddr     string
	queueDepth    int
	maxHeld       int // 0: derived from the memory limit (resolveMaxHeld)
	probePeriod   time.Duration
	probeTimeout  time.Duration
	clusterDomain string
	drainDelay    time.Duration
	gracePeriod   time.Duration
	logLevel      string
	kubeconfig    string
	statsAddr     string
	caFile        string
	tokenFile     string
	reportPeriod  time.Duration
	netPolicies   string
	// reconnect: ask kept-alive clients of targets served directly to
	// reconnect, once their target has been in Serve mode reconnectAfter.
	reconnect      bool
	reconnectAfter time.Duration
}

// The values of --network-policies.
const (
	networkPoliciesEnforce = "enforce"
	networkPoliciesIgnore  = "ignore"
)

func parseFlags(args []string) (*config, error) {
	c := &config{podIP: os.Getenv("POD_IP")}
	fs := flag.NewFlagSet("sockscale-activator", flag.ContinueOnError)
	fs.StringVar(&c.podName, "pod-name", os.Getenv("POD_NAME"), "this activator's pod name (default: $POD_NAME): it answers activator probes with it and takes its share of pods by it")
	fs.StringVar(&c.metricsAddr, "metrics-bind-address", ":9090", "address of the /metrics endpoint")
	securemetrics.BindFlags(fs, &c.metrics)
	fs.StringVar(&c.healthAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz (plain HTTP, no token: the kubelet probes it)")
	fs.StringVar(&c.proxyAddr, "proxy-bind-address", ":8012", "address that takes the targets' requests (HTTP/1.1 and h2c); a serving Route's host chooses among its revisions in Proxy mode first (the kernel split chose one of them)")
	fs.StringVar(&c.routeAddr, "route-bind-address", ":8013", "address that takes requests for serving Routes through their Services' EndpointSlices (no kernel split before): a Route's host chooses among all its revisions by percent; otherwise as --proxy-bind-address")
	fs.IntVar(&c.queueDepth, "queue-depth", throttle.DefaultQueueDepth, fmt.Sprintf("requests held per target at most; more get 503 (1..%d)", maxQueueDepth))
	fs.IntVar(&c.maxHeld, "max-held", 0, fmt.Sprintf("requests held at once for all targets together, shared fairly among namespaces: when full, a namespace holding less than its share takes the place of the newest request of the namespace holding the most, others get 503 (0..%d; 0: half the container's memory limit at %d KiB a request, or %d without a limit)",
		maxMaxHeld, holdpool.RequestCost>>10, holdpool.DefaultCapacity))
	fs.DurationVar(&c.probePeriod, "probe-period", readiness.DefaultPeriod, "how often a starting pod is probed until it answers, in its first second and while its target holds requests (then 3s more); otherwise the period doubles up to 5s (1ms..10s)")
	fs.DurationVar(&c.probeTimeout, "probe-timeout", readiness.DefaultTimeout, "timeout of one probe (1ms..10s)")
	fs.StringVar(&c.clusterDomain, "cluster-domain", resolve.DefaultClusterDomain, "the cluster's DNS domain, for Host names like name.namespace.svc.<domain>")
	fs.DurationVar(&c.drainDelay, "drain-delay", 5*time.Second, "after SIGTERM, how long to keep serving with readiness failed while endpoints drop this pod (0..grace period)")
	fs.DurationVar(&c.gracePeriod, "shutdown-grace-period", 30*time.Second, "after SIGTERM, how long held and forwarded requests have before they are ended; keep the pod's terminationGracePeriodSeconds above it (1s..1h)")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster config)")
	fs.StringVar(&c.statsAddr, "controller-stats-address", "", "host:port of the controller's stats Service (headless: every replica gets the stats); empty: do not report, so targets at zero never wake")
	fs.StringVar(&c.caFile, "controller-ca-file", "", "PEM CA that signs the controller's stats serving certificate: report over HTTPS, verifying the Service's name (reloaded when the file changes); empty: plain HTTP")
	fs.StringVar(&c.tokenFile, "controller-token-file", "", "file with this pod's projected ServiceAccount token for the controller (audience sockscale-controller), read again for every batch as the kubelet rotates it; empty: send no token (only a controller with --stats-insecure-skip-auth takes that)")
	fs.StringVar(&c.netPolicies, "network-policies", networkPoliciesEnforce, "enforce: forward a request to a pod only if the NetworkPolicies of the pod's namespace admit the request's client (its pod, namespace or address) to that pod, else 403; ignore: forward every request (any client that reaches the activator reaches every target)")
	fs.BoolVar(&c.reconnect, "reconnect-served-clients", true, "on the proxy port, move kept-alive clients of a target in Serve mode (its public endpoints are its pods) off the activator they reached while it was in Proxy mode, so their next connect takes the direct path: Connection: close on the pod's response (a graceful GOAWAY for h2c), idle HTTP/1.x connections closed, idle h2c ones sent GOAWAY (websockets and the route port are left alone)")
	fs.DurationVar(&c.reconnectAfter, "reconnect-served-after", handler.DefaultReconnectAfter, "how long a target must have been in Serve mode before its clients are asked to reconnect, so that kube-proxy and the agents have the new endpoints in place (0..1m)")
	fs.DurationVar(&c.reportPeriod, "report-period", stats.DefaultPeriod, "how often held and forwarded requests are reported (100ms..1m; the KPA expects 1s)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q: sockscale-activator takes flags only", fs.Args())
	}
	return c, c.validate()
}

func (c *config) validate() error {
	var errs []error
	if c.podName == "" {
		errs = append(errs, errors.New("--pod-name is empty: set it or $POD_NAME (the chart sets it from metadata.name)"))
	}
	if c.queueDepth < 1 || c.queueDepth > maxQueueDepth {
		errs = append(errs, fmt.Errorf("--queue-depth=%d: must be from 1 to %d", c.queueDepth, maxQueueDepth))
	}
	if c.maxHeld < 0 || c.maxHeld > maxMaxHeld {
		errs = append(errs, fmt.Errorf("--max-held=%d: must be from 0 (derived from the memory limit) to %d", c.maxHeld, maxMaxHeld))
	}
	for name, d := range map[string]time.Duration{"--probe-period": c.probePeriod, "--probe-timeout": c.probeTimeout} {
		if d < time.Millisecond || d > 10*time.Second {
			errs = append(errs, fmt.Errorf("%s=%v: must be from 1ms to 10s", name, d))
		}
	}
	if c.gracePeriod < time.Second || c.gracePeriod > time.Hour {
		errs = append(errs, fmt.Errorf("--shutdown-grace-period=%v: must be from 1s to 1h", c.gracePeriod))
	}
	if c.drainDelay < 0 || c.drainDelay >= c.gracePeriod {
		errs = append(errs, fmt.Errorf("--drain-delay=%v: must be from 0 to less than --shutdown-grace-period (%v)", c.drainDelay, c.gracePeriod))
	}
	if d := strings.TrimSuffix(c.clusterDomain, "."); d == "" || strings.ContainsAny(d, "/: ") {
		errs = append(errs, fmt.Errorf("--cluster-domain=%q: want a DNS domain such as cluster.local", c.clusterDomain))
	}
	for _, f := range []struct{ name, addr string }{
		{"--metrics-bind-address", c.metricsAddr}, {"--health-probe-bind-address", c.healthAddr}, {"--proxy-bind-address", c.proxyAddr},
		{"--route-bind-address", c.routeAddr},
	} {
		if _, _, err := net.SplitHostPort(f.addr); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: want [host]:port, e.g. :8012", f.name, f.addr))
		}
	}
	c.metrics.BindAddress = c.metricsAddr
	if err := c.metrics.Check(); err != nil {
		errs = append(errs, err)
	}
	if _, err := logflags.ParseLevel(c.logLevel); err != nil {
		errs = append(errs, err)
	}
	if c.statsAddr != "" {
		if h, p, err := net.SplitHostPort(c.statsAddr); err != nil || h == "" || p == "" {
			errs = append(errs, fmt.Errorf("--controller-stats-address=%q: want host:port, e.g. sockscale-controller-stats.sockscale-system.svc:8443", c.statsAddr))
		}
	}
	if c.netPolicies != networkPoliciesEnforce && c.netPolicies != networkPoliciesIgnore {
		errs = append(errs, fmt.Errorf("--network-policies=%q: want %s or %s", c.netPolicies, networkPoliciesEnforce, networkPoliciesIgnore))
	}
	if c.reconnectAfter < 0 || c.reconnectAfter > time.Minute {
		errs = append(errs, fmt.Errorf("--reconnect-served-after=%v: must be from 0 to 1m", c.reconnectAfter))
	}
	if c.reportPeriod < 100*time.Millisecond || c.reportPeriod > time.Minute {
		errs = append(errs, fmt.Errorf("--report-period=%v: must be from 100ms to 1m", c.reportPeriod))
	}
	return errors.Join(errs...)
}

// resolveMaxHeld is --max-held when set (flag > 0). At 0 it derives it
// from the memory limit of this process's cgroup (holdpool.CapacityFor),
// returning that limit too (0: none, holdpool.DefaultCapacity). A
// memory.max that cannot be read is an error, with DefaultCapacity.
func resolveMaxHeld(flag int, cgroupFS, selfCgroup string) (int, int64, error) {
	if flag > 0 {
		return flag, 0, nil
	}
	limit, err := memlimit.CgroupLimit(cgroupFS, selfCgroup)
	if err != nil {
		return holdpool.DefaultCapacity, 0, fmt.Errorf("derive --max-held: %w", err)
	}
	return holdpool.CapacityFor(limit), limit, nil
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sockscale-activator:", err)
		os.Exit(2)
	}
	level, _ := logflags.ParseLevel(cfg.logLevel)
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("component", "activator", "pod", cfg.podName)
	// Held requests grow the heap in bursts; with the runtime's limit
	// under the container's, the heap is collected before the kernel
	// kills the process and every held request with it.
	if soft, err := memlimit.Set(cgroupFS, selfCgroup); err != nil {
		log.Error("Go memory limit left unset", "err", err)
	} else if soft > 0 {
		log.Info("Go memory limit set to 90 % of the container's", "bytes", soft)
	}
	held, limit, err := resolveMaxHeld(cfg.maxHeld, cgroupFS, selfCgroup)
	switch {
	case err != nil:
		log.Error("held requests bounded by the default: the memory limit could not be read", "err", err, "maxHeld", held)
	case cfg.maxHeld > 0:
		log.Info("held requests bounded by --max-held", "maxHeld", held)
	case limit > 0:
		log.Info("held requests bounded by half the container's memory limit", "maxHeld", held, "memoryLimit", limit, "bytesPerRequest", holdpool.RequestCost)
	default:
		log.Info("held requests bounded by the default: the container has no memory limit", "maxHeld", held)
	}
	cfg.maxHeld = held
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("activator failed", "err", err)
		os.Exit(1)
	}
}

// With --metrics-secure every scrape's token and permission are asked of
// the API server (cached a minute for tokens, five for allowed requests).
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

func run(ctx context.Context, cfg *config, log *slog.Logger) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// Health, metrics, reports and the watches outlive the proxy's drain:
	// the kubelet must keep seeing /healthz, and held requests their pods,
	// while requests finish.
	aux, stopAux := context.WithCancel(context.Background())
	defer stopAux()

	// What the cluster says: targets (PodAutoscalers and their public
	// Services), the activators in each one's path (ServerlessServices),
	// their pods (the private Services' EndpointSlices), the host names
	// that route to them (Ingresses, HTTPRoutes) and the serving API's
	// Routes with their Services, in one cache.
	restCfg, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme, servingv1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			return err
		}
	}
	httpClient, err := rest.HTTPClientFor(restCfg)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	// The mapper tells the watcher whether the Gateway API is installed.
	mapper, err := apiutil.NewDynamicRESTMapper(restCfg, httpClient)
	if err != nil {
		return fmt.Errorf("discover the API server's kinds: %w", err)
	}
	// Every Service, EndpointSlice, Pod and Ingress of the cluster is
	// watched (and with --network-policies=enforce every Namespace and
	// NetworkPolicy), so the cache keeps of them only what is read.
	cacheOpts := cachetrim.Options()
	cacheOpts.Scheme, cacheOpts.Mapper, cacheOpts.HTTPClient = scheme, mapper, httpClient
	objects, err := cache.New(restCfg, cacheOpts)
	if err != nil {
		return fmt.Errorf("cache of the cluster's objects: %w", err)
	}
	// Uncached reads: whether Routes can be watched, before an informer
	// that cannot list them would hold up the sync for ever.
	direct, err := client.New(restCfg, client.Options{Scheme: scheme, Mapper: mapper, HTTPClient: httpClient})
	if err != nil {
		return fmt.Errorf("client of the API server: %w", err)
	}

	// The data path: targets by host -> held per target -> forwarded to a
	// ready pod. Readiness probes feed the throttle; the throttle's first
	// request held at zero pokes the controller through the stats counter.
	table := resolve.NewTable(cfg.clusterDomain)
	watcher := &watch.Watcher{Cache: objects, Table: table, Mapper: mapper, APIReader: direct, Registerer: reg, Log: log}
	var reporter stats.Reporter = logReporter{log}
	var sender *statsreport.Reporter
	if cfg.statsAddr != "" {
		if sender, err = statsreport.New(cfg.statsAddr, cfg.reportPeriod, stats.NewReportMetrics(reg), log); err != nil {
			return err
		}
		sender.SetTokenFile(cfg.tokenFile)
		if cfg.caFile != "" {
			if err := sender.SetCAFile(cfg.caFile); err != nil {
				return fmt.Errorf("--controller-ca-file: %w", err)
			}
		}
		reporter = &stats.Wire{Self: cfg.podName, Workload: watcher.Workload, Sender: sender, Context: aux, Log: log}
	}
	counter := stats.New(stats.Options{Reporter: reporter, Period: cfg.reportPeriod, Log: log})
	// The throttle takes the ready pods from the prober, and tells it of a
	// pod it could not reach, which the prober then probes until it answers,
	// and of requests held, which bring the target's starting pods back to
	// the fast probe period (OnCold at once, Held at each probe).
	var prober *readiness.Prober
	// One pool for both ports: held requests share one process's memory.
	// (main resolves --max-held=0; a caller that did not gets the default.)
	pool := holdpool.New(holdpool.Options{Capacity: cmp.Or(cfg.maxHeld, holdpool.DefaultCapacity), Registerer: reg})
	th := throttle.New(throttle.Options{Self: cfg.podName, QueueDepth: cfg.queueDepth, OnCold: func(k target.Key) { counter.Poke(k); prober.Wake(k) },
		OnUnreachable: func(k target.Key, pod netip.AddrPort) { prober.Unreachable(k, pod) }, Registerer: reg, Log: log})
	prober = readiness.New(readiness.Options{Sink: th, Period: cfg.probePeriod, Waiting: func(k target.Key) bool { return th.Held(k) > 0 }, Timeout: cfg.probeTimeout, Registerer: reg, Log: log})
	defer prober.Close()
	watcher.Throttle, watcher.Pods = th, prober
	// A Route's revision without a ready pod has this activator in its
	// path before its ServerlessService says Proxy.
	table.SetReadyPods(th.ReadyPods)

	// The NetworkPolicies of a target's namespace, applied for its pods
	// to the client of each request before it is forwarded: the pods see
	// the activator's address, which their policies must admit, so
	// without this check any client reaching the activator reaches them.
	var admitter *netpol.Admitter
	if cfg.netPolicies == networkPoliciesEnforce {
		admitter = netpol.New(netpol.Options{Reader: objects, Registerer: reg, Log: log})
	} else {
		log.Warn("--network-policies=ignore: every client that reaches the activator reaches every target, whatever the targets' NetworkPolicies")
	}

	// One handler per port, the same but for how a Route's own host
	// chooses its revision (resolve.Pick) and whether kept-alive clients
	// of targets in Serve mode are asked to reconnect (the route port's
	// would reconnect to an activator: a Route's addresses always lead to
	// them), counting into one set of metrics.
	metrics := handler.NewMetrics(reg)
	ports := []struct {
		flag, addr string
		pick       resolve.Pick
		reconnect  bool
	}{
		{"--proxy-bind-address", cfg.proxyAddr, resolve.ProxiedFirst, cfg.reconnect},
		{"--route-bind-address", cfg.routeAddr, resolve.AllRevisions, false},
	}
	base, stopRequests := context.WithCancelCause(context.Background())
	defer stopRequests(nil)
	var servers []*http.Server
	var listeners []net.Listener
	for _, p := range ports {
		ln, err := net.Listen("tcp", p.addr)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", p.flag, err)
		}
		defer func() { _ = ln.Close() }() // Serve closes it too; this is for an early return
		o := handler.Options{PodName: cfg.podName, Resolver: table.Picking(p.pick), Throttler: th, Stats: counter, Pool: pool, Metrics: metrics, Log: log}
		if admitter != nil {
			o.Admitter = admitter // not a nil *Admitter in the interface
		}
		if p.reconnect {
			o.Modes, o.ReconnectAfter = table, cfg.reconnectAfter
		}
		h := handler.New(o)
		srv := handler.NewServer(p.addr, h, base)
		srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn)
		if p.reconnect {
			// The idle connections of targets served directly are moved
			// too: closed (HTTP/1.x) or told GOAWAY (HTTP/2).
			conns := handler.NewConns(table, cfg.reconnectAfter, metrics, log)
			conns.Attach(srv)
			ln = conns.Listener(ln)
			go conns.Run(base)
		}
		servers, listeners = append(servers, srv), append(listeners, ln)
	}

	// Ready once every target known at start is in the table: before that
	// a request for an existing target would get a 404; and once the
	// policies can be checked: before that every forward gets a 503.
	health := &handler.Health{Ready: func() error {
		if !watcher.Synced() {
			return errors.New("targets are not synced from the API server yet")
		}
		if admitter != nil && !admitter.Synced() {
			return errors.New("pods, namespaces and NetworkPolicies are not synced from the API server yet")
		}
		return nil
	}}
	errc := make(chan error, 7)
	for i, srv := range servers {
		go func() {
			if err := srv.Serve(listeners[i]); !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("serve %s: %w", srv.Addr, err)
			}
		}()
	}
	go func() {
		errc <- securemetrics.Serve(aux, cfg.metrics, restCfg, metricsMux(reg), logr.FromSlogHandler(log.With("part", "metrics").Handler()))
	}()
	go func() { errc <- serve.Serve(aux, cfg.healthAddr, health.Handler()) }()
	go counter.Run(aux)
	if sender != nil {
		go sender.Run(aux)
	}
	go func() {
		if err := objects.Start(aux); err != nil {
			errc <- fmt.Errorf("cache: %w", err)
		}
	}()
	go func() {
		if err := watcher.Run(aux); err != nil {
			errc <- fmt.Errorf("watch targets: %w", err)
		}
	}()
	if admitter != nil {
		go func() {
			if err := admitter.Run(aux, objects); err != nil {
				errc <- fmt.Errorf("watch NetworkPolicies: %w", err)
			}
		}()
	}
	log.Info("activator started", "proxy", cfg.proxyAddr, "route", cfg.routeAddr, "podIP", cfg.podIP, "queueDepth", cfg.queueDepth, "maxHeld", pool.Capacity(), "probePeriod", cfg.probePeriod, "networkPolicies", cfg.netPolicies,
		"reconnectServedClients", cfg.reconnect, "reconnectServedAfter", cfg.reconnectAfter)

	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	handler.Drain(servers, health, stopRequests, cfg.drainDelay, cfg.gracePeriod, log)
	return nil
}

func metricsMux(reg *prometheus.Registry) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return mux
}

// logReporter is the Reporter without --controller-stats-address: it logs
// what it would send (at debug level, and every poke as a warning, since
// a target at zero then never wakes).
type logReporter struct{ log *slog.Logger }

func (r logReporter) Report(start time.Time, period time.Duration, recs []stats.Record) {
	for _, rec := range recs {
		r.log.Debug("stats", "target", rec.Key, "start", start, "period", period, "concurrency", rec.Concurrency, "requests", rec.Requests)
	}
}

func (r logReporter) Poke(key target.Key, at time.Time, inFlight int) {
	r.log.Warn("request held for a target with no ready pod, and no --controller-stats-address to wake it", "target", key, "inFlight", inFlight)
}
