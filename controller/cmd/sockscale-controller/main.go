// Command sockscale-controller runs the KPA controller: it receives the
// agents' stats, decides each PodAutoscaler's pod count and scales its
// target.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	// The zone database in the binary: a PodAutoscaler's minScaleSchedule
	// names an IANA time zone, and the image has no /usr/share/zoneinfo.
	_ "time/tzdata"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/bucket"
	"github.com/sockscale/sockscale/controller/internal/cachetrim"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/configwatch"
	"github.com/sockscale/sockscale/controller/internal/reconciler/collect"
	"github.com/sockscale/sockscale/controller/internal/reconciler/kpa"
	"github.com/sockscale/sockscale/controller/internal/reconciler/revision"
	"github.com/sockscale/sockscale/controller/internal/reconciler/route"
	"github.com/sockscale/sockscale/controller/internal/reconciler/service"
	"github.com/sockscale/sockscale/controller/internal/reconciler/sks"
	"github.com/sockscale/sockscale/controller/internal/release"
	"github.com/sockscale/sockscale/controller/internal/scaletarget"
	"github.com/sockscale/sockscale/controller/internal/securemetrics"
	"github.com/sockscale/sockscale/controller/internal/socketlayer"
	"github.com/sockscale/sockscale/controller/internal/statsauth"
	"github.com/sockscale/sockscale/controller/internal/statsserver"
	"github.com/sockscale/sockscale/internal/memlimit"
	"github.com/sockscale/sockscale/internal/stats"
)

type flags struct {
	metricsAddr, healthAddr, statsAddr string
	// pprofAddr serves net/http/pprof ("0": off).
	pprofAddr   string
	leaderElect bool
	// leaseNamespace holds the leader-election lease: POD_NAMESPACE, or
	// "" for controller-runtime's in-cluster default.
	leaseNamespace     string
	configMap          string // namespace/name
	activatorNamespace string
	activatorSelector  labels.Selector
	activatorPort      int
	activatorRoutePort int
	drainPort          int
	clusterDomain      string
	gateway            *types.NamespacedName
	externalDomain     string
	// statsAudience is the audience of the tokens agents and activators
	// send; statsInsecure turns authentication off (development only).
	statsAudience string
	statsInsecure bool
	// statsCert and statsKey: serve the stats over HTTPS.
	statsCert, statsKey string
	metrics             securemetrics.Config
	// release: hand the public Services back to Kubernetes and exit (the
	// chart's pre-delete hook), after scaling releaseStop to zero.
	release     bool
	releaseStop *types.NamespacedName
	// concurrentReconciles is how many PodAutoscalers (and collector
	// views, and ServerlessServices) are reconciled at once, and how many
	// PodAutoscaler statuses are written at once.
	concurrentReconciles int
	// scaleTargetKinds are the kinds a PodAutoscaler may scale.
	scaleTargetKinds scaletarget.Kinds
	// buckets splits the targets among the replicas (1: the leader
	// decides them all); bucketNamespace holds the buckets' Leases:
	// POD_NAMESPACE, else sockscale-system.
	buckets         int
	bucketNamespace string
	// metricsAPIAddr serves the custom and external metrics APIs ("0":
	// off), those of metricsAPIs, over TLS from metricsAPICert/Key.
	metricsAPIAddr                string
	metricsAPIs                   []string
	metricsAPICert, metricsAPIKey string
	// metricsWindow is how long the metrics APIs' and KEDA's scaler's
	// values average over.
	metricsWindow time.Duration
	// kedaAddr serves KEDA's external scaler ("0": off) over mutual TLS.
	kedaAddr, kedaCert, kedaKey, kedaClientCA string
}

// The bounds of --metrics-api-window: shorter than Knative's shortest
// stable window makes an HPA chase single seconds; longer than 10 minutes
// is slower than the HPA's own scale-down stabilization.
const (
	minMetricsWindow = 6 * time.Second
	maxMetricsWindow = 10 * time.Minute
)

// maxConcurrentReconciles bounds --concurrent-reconciles: beyond a
// thousand workers more would only queue at the API server.
const maxConcurrentReconciles = 1024

func parseFlags(args []string) (*flags, error) {
	f := &flags{}
	fs := flag.NewFlagSet("sockscale-controller", flag.ContinueOnError)
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", ":8080", "address of /metrics (\"0\": none)")
	fs.BoolVar(&f.metrics.Secure, "metrics-secure", true, "serve /metrics over HTTPS to callers the API server authenticates and authorizes (get on the /metrics non-resource URL); false: plain HTTP to anyone")
	fs.StringVar(&f.metrics.CertDir, "metrics-cert-path", "", "directory of the metrics server's certificate and key (empty: a self-signed one)")
	fs.StringVar(&f.metrics.CertName, "metrics-cert-name", "tls.crt", "certificate file in --metrics-cert-path")
	fs.StringVar(&f.metrics.KeyName, "metrics-cert-key", "tls.key", "key file in --metrics-cert-path")
	fs.BoolVar(&f.metrics.HTTP2, "enable-http2", false, "offer HTTP/2 on the metrics endpoint (off: its rapid-reset class of flaws)")
	fs.StringVar(&f.healthAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	fs.StringVar(&f.pprofAddr, "pprof-bind-address", "0", "address of Go's /debug/pprof profiles, for diagnosing CPU or memory (\"0\": off; it has no authentication, bind it to 127.0.0.1 and port-forward)")
	fs.StringVar(&f.statsAddr, "stats-bind-address", ":8443", "address where agents POST their stats (every replica listens, so a standby stays warm)")
	fs.StringVar(&f.statsAudience, "stats-token-audience", statsauth.DefaultAudience, "audience that agents' and activators' ServiceAccount tokens must carry (their projected token volumes' audience)")
	fs.StringVar(&f.statsCert, "stats-tls-cert-file", "", "PEM serving certificate of the stats endpoint (with --stats-tls-key-file: HTTPS, reloaded when the files change); empty: plain HTTP")
	fs.StringVar(&f.statsKey, "stats-tls-key-file", "", "PEM private key of --stats-tls-cert-file")
	fs.BoolVar(&f.statsInsecure, "stats-insecure-skip-auth", false, "DEVELOPMENT ONLY: take stats from anyone, unauthenticated: any pod can then scale any target")
	fs.BoolVar(&f.leaderElect, "leader-elect", false, "elect a leader so that only one replica scales targets")
	ns := os.Getenv("POD_NAMESPACE")
	f.leaseNamespace = ns
	if ns == "" {
		ns = "sockscale-system"
	}
	fs.StringVar(&f.configMap, "autoscaler-config", ns+"/sockscale-autoscaler", "namespace/name of the autoscaler ConfigMap (missing: built-in defaults)")
	fs.StringVar(&f.activatorNamespace, "activator-namespace", ns, "namespace of the activator pods (only pods there are activators: a tenant can copy their names and labels, not their namespace)")
	selector := fs.String("activator-selector", "app.kubernetes.io/component=activator", "label selector of the activator pods")
	fs.IntVar(&f.activatorPort, "activator-port", 8012, "port on which activators take proxied requests")
	fs.IntVar(&f.activatorRoutePort, "activator-route-port", 8013, "port on which activators split a Route's requests by its percents (the endpoints of a Route's addresses)")
	fs.IntVar(&f.drainPort, "drain-port", 0, "the node agents' drain port (their --drain-bind-address, on each node's loopback): the pods of serving Revisions get a preStop hook that waits there until the agent drained them (0: no hook)")
	fs.StringVar(&f.clusterDomain, "cluster-domain", "cluster.local", "the cluster's DNS domain, for the URLs of Services and Routes")
	gateway := fs.String("gateway", "", "namespace/name of the Gateway that serving Routes' HTTPRoutes attach to (empty: no HTTPRoutes)")
	fs.StringVar(&f.externalDomain, "external-domain", "example.com", "domain of serving Routes' external host names, <route>.<namespace>.<domain>, when --gateway is set")
	fs.BoolVar(&f.release, "release", false, "hand every public Service sockscale managed back to Kubernetes (the target's selector, none of sockscale's EndpointSlices) and exit: what an uninstall runs first")
	releaseStop := fs.String("release-stop", "", "with --release: namespace/name of the controller's Deployment, scaled to zero first so that it does not take the Services back (empty: not stopped)")
	// One worker decides at most 1 / (decision time) targets a second:
	// 10,000 targets every 2 s are 5,000 decisions a second, 200 us each
	// on one worker with nothing else to wait for; a decision that waits
	// on the API server (a /scale, a status write: a few ms) would make
	// every other target late. Eight workers overlap those waits.
	fs.IntVar(&f.concurrentReconciles, "concurrent-reconciles", 8, "PodAutoscalers, collector views and ServerlessServices reconciled at once, each kind (1..1024)")
	scaleTargetKinds := fs.String("scale-target-kinds", scaletarget.DefaultKinds().String(), "the kinds a PodAutoscaler's scaleTargetRef may name, comma-separated Kind.group (e.g. Deployment.apps,StatefulSet.apps,Rollout.argoproj.io); the controller's ClusterRole must grant get and update on each one's scale subresource")
	fs.IntVar(&f.buckets, "buckets", 1, fmt.Sprintf("split the targets into this many buckets, one Lease each, among the replicas (1..%d; 1: the leader decides every target); with more than 1, every replica decides the targets of the buckets it holds, and --leader-elect is needed", bucket.MaxCount))
	f.bucketNamespace = ns
	fs.StringVar(&f.metricsAPIAddr, "metrics-api-bind-address", "0", "address of the custom and external metrics APIs, behind their APIServices (\"0\": off)")
	metricsAPIs := fs.String("metrics-api", "custom,external", "the metrics APIs to serve, comma-separated: custom (custom.metrics.k8s.io, per pod), external (external.metrics.k8s.io, per Deployment)")
	fs.StringVar(&f.metricsAPICert, "metrics-api-tls-cert-file", "", "PEM serving certificate of the metrics APIs, the one their APIServices' caBundle signs (reloaded when it changes)")
	fs.StringVar(&f.metricsAPIKey, "metrics-api-tls-key-file", "", "PEM private key of --metrics-api-tls-cert-file")
	fs.DurationVar(&f.metricsWindow, "metrics-api-window", time.Minute, fmt.Sprintf("how long the metrics APIs' and KEDA's scaler's values average over (%s..%s)", minMetricsWindow, maxMetricsWindow))
	fs.StringVar(&f.kedaAddr, "keda-scaler-bind-address", "0", "address of KEDA's external scaler, gRPC over mutual TLS (\"0\": off)")
	fs.StringVar(&f.kedaCert, "keda-scaler-tls-cert-file", "", "PEM serving certificate of KEDA's scaler (reloaded when it changes)")
	fs.StringVar(&f.kedaKey, "keda-scaler-tls-key-file", "", "PEM private key of --keda-scaler-tls-cert-file")
	fs.StringVar(&f.kedaClientCA, "keda-scaler-client-ca-file", "", "PEM CA whose client certificates KEDA's scaler accepts (KEDA's TriggerAuthentication presents one)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var errs []error
	errs = append(errs, f.checkMetricsAPIs(*metricsAPIs)...)
	switch {
	case f.buckets < 1 || f.buckets > bucket.MaxCount:
		errs = append(errs, fmt.Errorf("--buckets=%d: want 1..%d", f.buckets, bucket.MaxCount))
	case f.buckets > 1 && !f.leaderElect:
		errs = append(errs, fmt.Errorf("--buckets=%d needs --leader-elect: the serving API's reconcilers still run on one leader", f.buckets))
	}
	if f.concurrentReconciles < 1 || f.concurrentReconciles > maxConcurrentReconciles {
		errs = append(errs, fmt.Errorf("--concurrent-reconciles=%d: want 1..%d", f.concurrentReconciles, maxConcurrentReconciles))
	}
	if kinds, err := scaletarget.ParseKinds(*scaleTargetKinds); err != nil {
		errs = append(errs, fmt.Errorf("--scale-target-kinds=%q: %w", *scaleTargetKinds, err))
	} else {
		f.scaleTargetKinds = kinds
	}
	if *releaseStop != "" {
		ns, name, ok := strings.Cut(*releaseStop, "/")
		switch {
		case !f.release:
			errs = append(errs, fmt.Errorf("--release-stop=%q needs --release", *releaseStop))
		case !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0:
			errs = append(errs, fmt.Errorf("--release-stop=%q: want namespace/name of the controller's Deployment, e.g. sockscale-system/sockscale-controller", *releaseStop))
		default:
			f.releaseStop = &types.NamespacedName{Namespace: ns, Name: name}
		}
	}
	sel, err := labels.Parse(*selector)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("--activator-selector=%q: %w", *selector, err))
	case sel.Empty():
		errs = append(errs, fmt.Errorf("--activator-selector=%q: must select something, e.g. app.kubernetes.io/component=activator", *selector))
	}
	f.activatorSelector = sel
	for name, port := range map[string]int{"--activator-port": f.activatorPort, "--activator-route-port": f.activatorRoutePort} {
		if port < 1 || port > 65535 {
			errs = append(errs, fmt.Errorf("%s=%d: want 1..65535", name, port))
		}
	}
	if f.drainPort < 0 || f.drainPort > 65535 {
		errs = append(errs, fmt.Errorf("--drain-port=%d: want 1..65535, or 0 for no drain hook", f.drainPort))
	}
	if bad := validation.IsDNS1123Subdomain(f.clusterDomain); len(bad) > 0 {
		errs = append(errs, fmt.Errorf("--cluster-domain=%q: want a DNS domain such as cluster.local (%s)", f.clusterDomain, bad[0]))
	}
	if bad := validation.IsDNS1123Subdomain(f.externalDomain); len(bad) > 0 {
		errs = append(errs, fmt.Errorf("--external-domain=%q: want a DNS domain such as example.com (%s)", f.externalDomain, bad[0]))
	}
	if *gateway != "" {
		ns, name, ok := strings.Cut(*gateway, "/")
		if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
			errs = append(errs, fmt.Errorf("--gateway=%q: want namespace/name of a Gateway, e.g. gateway-system/public", *gateway))
		} else {
			f.gateway = &types.NamespacedName{Namespace: ns, Name: name}
		}
	}
	f.metrics.BindAddress = f.metricsAddr
	if _, err := securemetrics.Options(f.metrics); err != nil {
		errs = append(errs, err)
	}
	for name, addr := range map[string]string{"--metrics-bind-address": f.metricsAddr, "--health-probe-bind-address": f.healthAddr, "--stats-bind-address": f.statsAddr, "--pprof-bind-address": f.pprofAddr,
		"--metrics-api-bind-address": f.metricsAPIAddr, "--keda-scaler-bind-address": f.kedaAddr} {
		if addr == "0" && name != "--health-probe-bind-address" && name != "--stats-bind-address" {
			continue // off
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: want [host]:port, e.g. :8080", name, addr))
		}
	}
	if f.statsAudience == "" || strings.ContainsAny(f.statsAudience, " ,\t\n") {
		errs = append(errs, fmt.Errorf("--stats-token-audience=%q: want one audience, non-empty, without spaces or commas, e.g. %s", f.statsAudience, statsauth.DefaultAudience))
	}
	if (f.statsCert == "") != (f.statsKey == "") {
		errs = append(errs, fmt.Errorf("--stats-tls-cert-file=%q and --stats-tls-key-file=%q: set both (HTTPS) or neither (HTTP)", f.statsCert, f.statsKey))
	}
	if msgs := validation.IsDNS1123Label(f.activatorNamespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--activator-namespace=%q: want the namespace the activators run in (a namespace name: %s)", f.activatorNamespace, strings.Join(msgs, "; ")))
	}
	if ns, name, ok := strings.Cut(f.configMap, "/"); !ok || ns == "" || name == "" {
		errs = append(errs, fmt.Errorf("--autoscaler-config=%q: want namespace/name", f.configMap))
	}
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q: sockscale-controller takes flags only", fs.Args()))
	}
	return f, errors.Join(errs...)
}

// checkMetricsAPIs checks the flags of the metrics APIs and KEDA's scaler
// (apis: --metrics-api) and keeps the APIs' list.
func (f *flags) checkMetricsAPIs(apis string) []error {
	var errs []error
	seen := map[string]bool{}
	for _, api := range strings.Split(apis, ",") {
		switch {
		case api != "custom" && api != "external":
			errs = append(errs, fmt.Errorf("--metrics-api=%q: %q is not an API; want custom, external or custom,external", apis, api))
		case seen[api]:
			errs = append(errs, fmt.Errorf("--metrics-api=%q: %s twice", apis, api))
		default:
			seen[api] = true
			f.metricsAPIs = append(f.metricsAPIs, api)
		}
	}
	if f.metricsWindow < minMetricsWindow || f.metricsWindow > maxMetricsWindow {
		errs = append(errs, fmt.Errorf("--metrics-api-window=%s: want %s..%s", f.metricsWindow, minMetricsWindow, maxMetricsWindow))
	}
	if f.metricsAPIAddr != "0" && (f.metricsAPICert == "" || f.metricsAPIKey == "") {
		errs = append(errs, fmt.Errorf("--metrics-api-bind-address=%q needs --metrics-api-tls-cert-file and --metrics-api-tls-key-file (got %q and %q): the API server verifies the metrics APIs' certificate against their APIServices' caBundle",
			f.metricsAPIAddr, f.metricsAPICert, f.metricsAPIKey))
	}
	if f.kedaAddr != "0" && (f.kedaCert == "" || f.kedaKey == "" || f.kedaClientCA == "") {
		errs = append(errs, fmt.Errorf("--keda-scaler-bind-address=%q needs --keda-scaler-tls-cert-file, --keda-scaler-tls-key-file and --keda-scaler-client-ca-file (got %q, %q, %q): KEDA's scaler takes clients with a certificate of that CA only",
			f.kedaAddr, f.kedaCert, f.kedaKey, f.kedaClientCA))
	}
	return errs
}

func main() {
	f, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sockscale-controller:", err)
		os.Exit(2)
	}
	ctrl.SetLogger(zap.New())
	// The informer caches and windows grow with the targets; with the
	// runtime's limit under the container's, the heap is collected
	// before the kernel kills the process.
	if soft, err := memlimit.Set("/sys/fs/cgroup", "/proc/self/cgroup"); err != nil {
		ctrl.Log.Error(err, "Go memory limit left unset")
	} else if soft > 0 {
		ctrl.Log.Info("Go memory limit set to 90 % of the container's", "bytes", soft)
	}
	if err := run(ctrl.SetupSignalHandler(), f); err != nil {
		ctrl.Log.Error(err, "controller failed")
		os.Exit(1)
	}
}

func run(ctx context.Context, f *flags) error {
	scheme, err := newScheme()
	if err != nil {
		return err
	}
	if f.release {
		return runRelease(ctx, scheme, f.releaseStop)
	}
	return runController(ctx, f, scheme)
}

// runRelease is --release: the chart's pre-delete hook runs it with the
// controller's ServiceAccount while the chart's objects still exist.
func runRelease(ctx context.Context, scheme *runtime.Scheme, stop *types.NamespacedName) error {
	c, err := client.New(ctrl.GetConfigOrDie(), client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	res, err := release.Release(ctx, c, release.Options{Controller: stop})
	if err != nil {
		return fmt.Errorf("release public Services: %w", err)
	}
	ctrl.Log.Info("released: public Services handed back to Kubernetes", "services", res.Services, "endpointSlicesDeleted", res.Slices, "servicesSkipped", res.Skipped)
	return nil
}

func newScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := servingv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return scheme, nil
}

func runController(ctx context.Context, f *flags, scheme *runtime.Scheme) error {
	metricsOpts, err := securemetrics.Options(f.metrics)
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsOpts,
		HealthProbeBindAddress:  f.healthAddr,
		PprofBindAddress:        f.pprofAddr,
		LeaderElection:          f.leaderElect,
		LeaderElectionID:        "sockscale-controller.sockscale.dev",
		LeaderElectionNamespace: f.leaseNamespace,
		// A leader that stops (a rollout, a drain) hands the lease over at
		// once instead of letting it run out: the standby, its windows
		// warm, decides within a retry period (2 s) rather than the lease
		// duration (15 s). run returns as soon as the manager stops, as
		// this needs.
		LeaderElectionReleaseOnCancel: true,
		// Of all pods, only the activators are watched; no object keeps
		// its managedFields (4.5 % of the heap at 3,000 targets); the
		// Deployments and EndpointSlices sockscale does not control keep
		// only what it reads of them.
		Cache: cachetrim.Options(f.activatorSelector),
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	// The autoscaler ConfigMap: read once before starting, then re-read
	// every 10 s on every replica.
	cfg, err := configwatch.Load(ctx, mgr.GetAPIReader(), f.configMap)
	if err != nil {
		return err
	}
	var current atomic.Pointer[config.Config]
	current.Store(cfg)
	if err := mgr.Add(&configwatch.Watcher{Reader: mgr.GetAPIReader(), Ref: f.configMap, Current: &current, Period: 10 * time.Second, Clock: clock.RealClock{}}); err != nil {
		return err
	}

	col := collector.New(clock.RealClock{})
	crmetrics.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sockscale_controller_collected_targets",
		Help: "PodAutoscalers whose windows this replica keeps, leader or not: on a warm standby it equals the leader's.",
	}, func() float64 { return float64(col.Len()) }))
	buckets, err := newBuckets(mgr, f)
	if err != nil {
		return err
	}
	// Read only when a target's /scale is not found: a missing target
	// and a kind without /scale are told apart by the API's discovery.
	disco, err := discovery.NewDiscoveryClientForConfig(mgr.GetConfig())
	if err != nil {
		return fmt.Errorf("discovery client: %w", err)
	}
	pa := &kpa.PodAutoscaler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Collector: col, Clock: clock.RealClock{}, Config: current.Load, Buckets: buckets,
		ScaleTargetKinds:        f.scaleTargetKinds,
		Discovery:               disco,
		Metrics:                 kpa.NewMetrics(crmetrics.Registry),
		Prober:                  &kpa.HTTPProber{Resolve: sks.PublicAddress(mgr.GetClient())},
		Events:                  mgr.GetEventRecorder("sockscale-controller"),
		MaxConcurrentReconciles: f.concurrentReconciles,
		// As many status writers as deciders: a decision no longer waits
		// for its status write, and the writes keep pace with changes.
		StatusWriters: f.concurrentReconciles}
	nodes := socketlayer.NewTracker(clock.RealClock{})
	nodesChanged := make(chan event.GenericEvent, 1)
	if err := mgr.Add(&socketlayer.Notifier{Tracker: nodes, C: nodesChanged, Object: &v1alpha1.ServerlessService{}}); err != nil {
		return err
	}
	// Every replica takes stats, leader or not: a standby has warm windows
	// (and knows the nodes' socket-layer states). Load for a target at
	// zero pokes its decider at once.
	recordRecent, err := setupMetricsAPIs(mgr, f)
	if err != nil {
		return err
	}
	statsOpts := statsserver.Options{
		Accept: func(b *stats.Batch) error {
			pa.Poke(append(col.RecordPods(b), col.RecordTargets(b)...))
			nodes.Record(b)
			if recordRecent != nil {
				recordRecent(b)
			}
			return nil
		},
		// The metrics APIs serve every Deployment, autoscaled or not.
		KeepUnwatched: recordRecent != nil,
		Metrics:       statsserver.NewMetrics(crmetrics.Registry),
		Log:           statsserver.NewRateLimitedLog(ctrl.Log.WithName("stats"), clock.RealClock{}),
		// With buckets, each answer tells the reporter which targets'
		// records this replica wants.
		Buckets: buckets.Header,
	}
	limit := func(h http.Handler) http.Handler { return h }
	if f.statsInsecure {
		ctrl.Log.Info("WARNING: --stats-insecure-skip-auth is set: the stats endpoint takes batches from anyone, so any pod in the cluster can scale any target; use it for development only")
	} else {
		// Agents' pod records are checked against the targets' private
		// Services' endpoints, which the collector is told (collect).
		auth := statsauth.New(statsauth.Options{Audience: f.statsAudience, Reviewer: statsauth.APIReviewer{Client: mgr.GetClient()},
			Metrics: statsauth.NewMetrics(crmetrics.Registry)})
		statsOpts.Auth = auth
		statsOpts.Pods = col
		// Uncached tokens are rate limited per source address before the
		// handler's in-flight bound: a pod forging tokens gets 429 at the
		// cost of a hash, not a TokenReview nor one of the 256 slots.
		limit = auth.LimitReviews
	}
	if err := mgr.Add(&statsserver.Server{Addr: f.statsAddr, Handler: limit(statsserver.Handler(statsOpts)), CertFile: f.statsCert, KeyFile: f.statsKey}); err != nil {
		return err
	}
	if err := pa.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the PodAutoscaler controller: %w", err)
	}
	// Every replica keeps the collector's view of every PodAutoscaler (its
	// windows' settings, the ready pods it expects stats from).
	if err := (&collect.Reconciler{Client: mgr.GetClient(), Collector: col, Config: current.Load, ScaleTargetKinds: f.scaleTargetKinds,
		MaxConcurrentReconciles: f.concurrentReconciles}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the collector's PodAutoscaler watch: %w", err)
	}
	ss := &sks.ServerlessService{Client: mgr.GetClient(), ActivatorNamespace: f.activatorNamespace,
		ActivatorSelector: f.activatorSelector, ActivatorPort: int32(f.activatorPort),
		SocketLayer: nodes, SocketLayerChanged: nodesChanged, MaxConcurrentReconciles: f.concurrentReconciles, Buckets: buckets}
	if err := ss.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the ServerlessService controller: %w", err)
	}
	// The serving API: a Service's template makes Revisions, and each
	// Revision the Deployment, public Service and PodAutoscaler above.
	if err := (&revision.Reconciler{Client: mgr.GetClient(), Config: current.Load, DrainPort: int32(f.drainPort)}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the Revision controller: %w", err)
	}
	if err := (&service.Reconciler{Client: mgr.GetClient(), Config: current.Load}).SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the serving Service controller: %w", err)
	}
	rt := &route.Reconciler{Client: mgr.GetClient(), ActivatorNamespace: f.activatorNamespace, ActivatorSelector: f.activatorSelector,
		ActivatorRoutePort: int32(f.activatorRoutePort), ClusterDomain: f.clusterDomain, Config: current.Load,
		Gateway: f.gateway, Domain: f.externalDomain}
	if f.gateway != nil {
		// HTTPRoutes are written where the Gateway API is installed when
		// the controller starts (restart it after installing it).
		served, err := route.HTTPRoutesServed(mgr.GetRESTMapper())
		if err != nil {
			return err
		}
		rt.HTTPRoutes = served
		if !served {
			ctrl.Log.Info("--gateway is set but the API server serves no gateway.networking.k8s.io/v1 HTTPRoutes: Routes get no HTTPRoutes until the Gateway API is installed and the controller restarted", "gateway", f.gateway.String())
		}
	}
	if err := rt.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the Route controller: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// newBuckets makes and adds to mgr the elections of --buckets, or returns
// nil (the leader decides every target) for --buckets=1. A replica is
// named in the Leases by its pod's name (POD_NAME), else by its host
// name and a random suffix, as controller-runtime names its leader.
func newBuckets(mgr ctrl.Manager, f *flags) (*bucket.Set, error) {
	if f.buckets == 1 {
		return nil, nil
	}
	id := os.Getenv("POD_NAME")
	if id == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("name this replica in the bucket Leases: %w", err)
		}
		id = host + "_" + string(uuid.NewUUID())
	}
	cs, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return nil, fmt.Errorf("bucket Lease client: %w", err)
	}
	set, err := bucket.New(bucket.Options{Count: f.buckets, Namespace: f.bucketNamespace, Identity: id,
		Leases: cs.CoordinationV1(), Log: ctrl.Log.WithName("buckets"), Registerer: crmetrics.Registry})
	if err != nil {
		return nil, err
	}
	return set, mgr.Add(set)
}
