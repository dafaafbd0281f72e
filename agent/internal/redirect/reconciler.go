// This file: the Reconciler, its options and its construction; its watch
// lifecycle is in watch.go, its inputs in inputs.go, its writes to the
// kernel map in sync.go.

package redirect

import (
	"errors"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	bpfredirect "github.com/sockscale/sockscale/bpf/redirect"
)

// Map is the kernel's redirect map, as bpf/redirect's Redirect has it.
type Map interface {
	Set(svc netip.AddrPort, backends []bpfredirect.Backend) error
	Delete(svc netip.AddrPort) error
	Forget(svc netip.AddrPort) error
	Entries() (map[netip.AddrPort][]bpfredirect.Backend, error)
	Redirected() (map[netip.AddrPort]uint64, error)
	Events() (bpfredirect.Events, error)
	Renew(ttl time.Duration) error
}

// DefaultResyncPeriod is how often the whole kernel map is read back and
// compared with the desired state: something else may have written it, and
// failed writes are retried (also a second after they fail).
const DefaultResyncPeriod = 10 * time.Second

// LeaseTTL is how far ahead each full sync that left the map equal to the
// cluster renews the kernel's lease on the entries (bpf/redirect,
// Options.Lease): three resyncs. An agent that stops syncing (gone,
// stuck, or failing to write) lets the lease lapse, and the programs then
// ignore its entries, so connects take kube-proxy's path, which the
// public EndpointSlices keep right on their own.
const LeaseTTL = 3 * DefaultResyncPeriod

// retryAfter is how soon a sync whose writes failed is tried again.
const retryAfter = time.Second

// Options configure a Reconciler.
type Options struct {
	Map Map
	// ActivatorNamespace ("" for all) and ActivatorSelector find the
	// activator pods whose names status.activators lists.
	ActivatorNamespace string
	ActivatorSelector  labels.Selector
	// ActivatorPort is where activators take proxied requests.
	ActivatorPort uint16
	// ResyncPeriod: 0 means DefaultResyncPeriod.
	ResyncPeriod time.Duration
	// Required makes Run return an error when the watches cannot start or
	// have not synced within SyncTimeout (the agent's
	// --socket-redirect=on). Otherwise Run clears the map, State says
	// unavailable, and it retries: the API objects may be installed or
	// allowed later, and the agent's accounting must keep running.
	//
	// The Routes' watch is never required: the serving API is optional.
	// Without it the Routes' addresses get no entry (their Kubernetes
	// Services keep kube-proxy's path), the ServerlessServices' entries
	// work as before, State's reason says so, and it retries in the same
	// steps.
	Required bool
	// SyncTimeout bounds the wait for the caches' first sync: a list that
	// is forbidden makes the informers retry forever rather than fail.
	// 0 means DefaultSyncTimeout.
	SyncTimeout time.Duration
	// RetryBackoff is the wait before the first retry of watches that
	// could not start; it doubles up to MaxRetryBackoff. 0 means
	// DefaultRetryBackoff.
	RetryBackoff time.Duration
	// Clock drives resyncs, latencies and retries; nil means the real clock.
	Clock      clock.WithTicker
	Log        *slog.Logger
	Registerer prometheus.Registerer
}

// Defaults of Options.
const (
	DefaultSyncTimeout  = 60 * time.Second
	DefaultRetryBackoff = 5 * time.Second
	// MaxRetryBackoff: a CRD installed or RBAC granted later is picked
	// up within 5 minutes, at a cost of one failed list every 5 minutes.
	MaxRetryBackoff = 5 * time.Minute
)

// cacheFactory makes the caches of one attempt to watch, with
// onWatchError as their watch error handler.
type cacheFactory func(onWatchError toolscache.WatchErrorHandlerWithContext) (cache.Cache, error)

// cacheFactories make the caches of the ServerlessServices, Services and
// activator pods, and apart from them those of the Routes, so that a
// missing serving CRD stops only the Routes' entries.
type cacheFactories struct {
	main, routes cacheFactory
}

// Reconciler keeps the node's redirect map equal to Compute of the
// ServerlessServices, Services, activator pods and Routes it watches.
//
// It is level triggered: every event (and a periodic resync) recomputes the
// whole desired state from the caches and writes only the difference, so
// the order of events does not matter and nothing is lost between them.
// An event's sync compares with what this Reconciler last wrote; a resync
// (at start, every ResyncPeriod, and after a failed write) compares with
// the map read back from the kernel, and removes every entry that is not
// desired: the map is pinned, so it holds what an earlier agent wrote.
//
// Only connects are redirected: the kernel rewrites a socket's destination
// when it connects, so a connection made in Proxy mode stays with its
// activator after the switch to Serve, and one made in Serve mode stays
// with its pod after the switch to Proxy. Neither is dropped: activators
// keep serving the keep-alive connections they have (forwarding to the
// pods), and pods keep theirs until the client or the pod closes them
// (a pod scaled away drains its connections as for any Service).
type Reconciler struct {
	opts     Options
	newCache cacheFactories
	// cache is the current attempt's; only Run's goroutine uses it.
	cache   cache.Cache
	metrics *metrics
	health  health
	// routes is the Routes' watch, which runs beside the others.
	routes routeWatch
	// kick asks the loop for a sync; one pending kick is enough.
	kick   chan struct{}
	synced atomic.Bool

	mu sync.Mutex
	// applied is what the kernel map holds as far as this Reconciler
	// knows; nil after a failed write or before the first resync: the
	// next sync reads the map back.
	applied map[netip.AddrPort][]bpfredirect.Backend
	// observed are ServerlessServices whose status change was seen and
	// not yet written, with when it was first seen.
	observed map[types.NamespacedName]time.Time
	// targets names the ServerlessService, Route or tag of each address
	// (Desired.Targets), for the per-target counters.
	targets map[netip.AddrPort]Target
}

// New makes a Reconciler watching the API server at cfg. The watches start
// with Run.
func New(cfg *rest.Config, opts Options) (*Reconciler, error) {
	scheme := kruntime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := servingv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	sel := opts.ActivatorSelector
	if sel == nil || sel.Empty() {
		// Every pod of the cluster would be an activator candidate.
		return nil, errors.New("redirect: the activator selector is empty; the activator pods cannot be found")
	}
	pods := cache.ByObject{Label: sel}
	if opts.ActivatorNamespace != "" {
		pods.Namespaces = map[string]cache.Config{opts.ActivatorNamespace: {}}
	}
	// A cache per attempt: a new one also has a new REST mapper, which
	// finds a CRD installed since the last attempt.
	newCache := func(onWatchError toolscache.WatchErrorHandlerWithContext) (cache.Cache, error) {
		return cache.New(cfg, cache.Options{
			Scheme:                   scheme,
			ByObject:                 map[client.Object]cache.ByObject{&corev1.Pod{}: pods},
			DefaultTransform:         cache.TransformStripManagedFields(),
			DefaultWatchErrorHandler: onWatchError,
		})
	}
	newRouteCache := func(onWatchError toolscache.WatchErrorHandlerWithContext) (cache.Cache, error) {
		return cache.New(cfg, cache.Options{
			Scheme:                   scheme,
			DefaultTransform:         cache.TransformStripManagedFields(),
			DefaultWatchErrorHandler: onWatchError,
		})
	}
	return newReconciler(cacheFactories{main: newCache, routes: newRouteCache}, opts), nil
}

func newReconciler(newCache cacheFactories, opts Options) *Reconciler {
	if opts.ResyncPeriod <= 0 {
		opts.ResyncPeriod = DefaultResyncPeriod
	}
	if opts.SyncTimeout <= 0 {
		opts.SyncTimeout = DefaultSyncTimeout
	}
	if opts.RetryBackoff <= 0 {
		opts.RetryBackoff = DefaultRetryBackoff
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry() // nobody scrapes it
	}
	r := &Reconciler{
		opts:     opts,
		newCache: newCache,
		kick:     make(chan struct{}, 1),
		observed: make(map[types.NamespacedName]time.Time),
		targets:  make(map[netip.AddrPort]Target),
	}
	r.metrics = newMetrics(opts.Registerer, r)
	return r
}

// Synced says whether the map has been made equal to the cluster once.
func (r *Reconciler) Synced() bool { return r.synced.Load() }
