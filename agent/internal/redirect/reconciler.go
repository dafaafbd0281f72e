package redirect

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
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

// Run watches until ctx ends. Once the caches are filled it resyncs the
// kernel map (retrying every second until that succeeds), then follows
// events and resyncs every ResyncPeriod. Stopping leaves the map as it is:
// its entries keep redirecting, and the next agent resyncs them.
//
// When the watches cannot start (a missing CRD), stop, or have not synced
// within SyncTimeout (a forbidden list), Run returns the error if
// Options.Required; otherwise it clears the map, State says unavailable,
// and it tries again after RetryBackoff, doubling up to MaxRetryBackoff.
//
// The Routes' watch runs beside, with attempts of its own (runRoutes).
func (r *Reconciler) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var routes sync.WaitGroup
	defer routes.Wait()
	defer cancel() // before the Wait: it ends the Routes' watch
	routes.Go(func() { r.runRoutes(ctx) })
	backoff := r.opts.RetryBackoff
	for {
		err := r.attempt(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if r.opts.Required {
			return fmt.Errorf("redirect: %w", err)
		}
		if r.Synced() {
			backoff = r.opts.RetryBackoff // it worked for a while: not the same failure
		}
		r.opts.Log.Warn("socket-layer redirect unavailable: its map is cleared and Proxy mode goes through the public EndpointSlices (kube-proxy) only; retrying. --socket-redirect=on makes this fatal",
			"err", err, "retryIn", backoff)
		r.giveUp(err)
		select {
		case <-ctx.Done():
			return nil
		case <-r.opts.Clock.After(backoff):
		}
		backoff = min(2*backoff, MaxRetryBackoff)
	}
}

// The attempt's informers: list and watch; Get and List read the cache.
// +kubebuilder:rbac:groups=sockscale.dev,resources=serverlessservices,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=services,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;watch

// attempt runs one set of watches until ctx ends (nil) or they fail.
func (r *Reconciler) attempt(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops this attempt's informers
	r.synced.Store(false)
	c, err := r.newCache.main(r.watchFailed)
	if err != nil {
		return fmt.Errorf("make the cache: %w", err)
	}
	r.cache = c
	for _, obj := range []client.Object{&v1alpha1.ServerlessService{}, &corev1.Service{}, &corev1.Pod{}} {
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("watch %T: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(r.eventHandler()); err != nil {
			return fmt.Errorf("watch %T: %w", obj, err)
		}
	}
	cacheErr := make(chan error, 1)
	go func() { cacheErr <- c.Start(ctx) }()
	if err := r.waitForCaches(ctx, cacheErr); err != nil || ctx.Err() != nil {
		return err
	}
	r.noteCachesSynced()
	clk := r.opts.Clock
	// Until the first resync has read the pinned map back, entries an
	// earlier agent left may be stale: keep trying.
	for {
		err := r.sync(ctx, true)
		r.noteSync(err)
		if err == nil {
			break
		}
		r.opts.Log.Warn("first sync of the redirect map; retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-clk.After(retryAfter):
		}
	}
	r.synced.Store(true)
	r.opts.Log.Info("redirect map in sync", "entries", r.entryCount())
	tick := clk.NewTicker(r.opts.ResyncPeriod)
	defer tick.Stop()
	var retry <-chan time.Time
	for {
		full := false
		select {
		case <-ctx.Done():
			return nil
		case err := <-cacheErr:
			return watchesStopped(ctx, err)
		case <-r.kick:
		case <-tick.C():
			full = true
		case <-retry:
			full = true
		}
		retry = nil
		err := r.sync(ctx, full)
		r.noteSync(err)
		if err != nil {
			r.opts.Log.Warn("sync the redirect map; retrying", "err", err)
			retry = clk.After(retryAfter)
		}
	}
}

// waitForCaches waits for the caches' first sync. Past SyncTimeout
// without it, the map is cleared (or, if Required, that is an error) and
// the wait goes on: the informers retry their lists on their own, so a
// permission granted later is picked up without a new attempt.
func (r *Reconciler) waitForCaches(ctx context.Context, cacheErr <-chan error) error {
	synced := make(chan bool, 1)
	go func() { synced <- r.cache.WaitForCacheSync(ctx) }()
	timeout := r.opts.Clock.After(r.opts.SyncTimeout)
	for {
		select {
		case ok := <-synced:
			if ok || ctx.Err() != nil {
				return nil
			}
			return errors.New("the caches never synced")
		case err := <-cacheErr:
			return watchesStopped(ctx, err)
		case <-timeout:
			timeout = nil
			err := fmt.Errorf("the caches have not synced in %v", r.opts.SyncTimeout)
			if werr := r.lastWatchError(); werr != nil {
				err = fmt.Errorf("%w: %w", err, werr)
			}
			if r.opts.Required {
				return err
			}
			r.opts.Log.Warn("socket-layer redirect unavailable: its map is cleared until the caches sync; Proxy mode goes through the public EndpointSlices (kube-proxy) only",
				"err", err)
			r.giveUp(err)
		}
	}
}

// watchesStopped is the error of a cache that returned: none if ctx ended
// (the cache may return before the caller's select sees ctx.Done).
func watchesStopped(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return nil
	case err == nil:
		return errors.New("the watches stopped")
	default:
		return fmt.Errorf("the watches stopped: %w", err)
	}
}

// eventHandler calls event on every change of a watched object.
func (r *Reconciler) eventHandler() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { r.event(nil, o) },
		UpdateFunc: func(old, o any) { r.event(old, o) },
		DeleteFunc: func(o any) { r.event(nil, o) },
	}
}

// event notes a ServerlessService's status change (for the latency metric)
// and asks for a sync.
func (r *Reconciler) event(old, obj any) {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if sks, ok := obj.(*v1alpha1.ServerlessService); ok && r.synced.Load() {
		prev, _ := old.(*v1alpha1.ServerlessService)
		if prev == nil || statusChanged(prev, sks) {
			key := types.NamespacedName{Namespace: sks.Namespace, Name: sks.Name}
			r.mu.Lock()
			if _, ok := r.observed[key]; !ok {
				r.observed[key] = r.opts.Clock.Now()
			}
			r.mu.Unlock()
		}
	}
	r.kickSync()
}

// kickSync asks the loop for a sync.
func (r *Reconciler) kickSync() {
	select {
	case r.kick <- struct{}{}:
	default: // a sync is pending already; it will see this change
	}
}

// statusChanged says whether the parts of the status that Compute reads
// changed.
func statusChanged(a, b *v1alpha1.ServerlessService) bool {
	return a.Status.Mode != b.Status.Mode || !slices.Equal(a.Status.Activators, b.Status.Activators) ||
		!equality.Semantic.DeepEqual(a.Status.Conditions, b.Status.Conditions)
}

// inputs reads Compute's inputs from the caches.
func (r *Reconciler) inputs(ctx context.Context) (Inputs, error) {
	in := Inputs{
		Services:      make(map[types.NamespacedName]*corev1.Service),
		Activators:    make(map[string]netip.Addr),
		ActivatorPort: r.opts.ActivatorPort,
	}
	var skses v1alpha1.ServerlessServiceList
	if err := r.cache.List(ctx, &skses); err != nil {
		return in, fmt.Errorf("list ServerlessServices: %w", err)
	}
	in.ServerlessServices = skses.Items
	for i := range skses.Items {
		s := &skses.Items[i]
		key := types.NamespacedName{Namespace: s.Namespace, Name: s.Spec.PublicService}
		var svc corev1.Service
		if err := r.cache.Get(ctx, key, &svc); err == nil {
			in.Services[key] = &svc
		}
	}
	if err := r.routeInputs(ctx, &in); err != nil {
		return in, err
	}
	var pods corev1.PodList
	if err := r.cache.List(ctx, &pods); err != nil {
		return in, fmt.Errorf("list activator pods: %w", err)
	}
	dup := make(map[string]bool)
	for i := range pods.Items {
		p := &pods.Items[i]
		ip, ok := isReadyActivator(p)
		if !ok {
			continue
		}
		// status.activators names pods without their namespace: with
		// activators in several namespaces, a name two of them share
		// cannot be told apart, and neither is used.
		if _, seen := in.Activators[p.Name]; seen || dup[p.Name] {
			dup[p.Name] = true
			delete(in.Activators, p.Name)
			continue
		}
		in.Activators[p.Name] = ip
	}
	return in, nil
}

// routeInputs reads the Routes' part of Compute's inputs: the Services
// with the route label, and, while the Routes' watch works, the Routes and
// the public Services of the revisions in their status.traffic.
func (r *Reconciler) routeInputs(ctx context.Context, in *Inputs) error {
	var svcs corev1.ServiceList
	if err := r.cache.List(ctx, &svcs, client.HasLabels{servingv1alpha1.RouteLabelKey}); err != nil {
		return fmt.Errorf("list Route Services: %w", err)
	}
	for i := range svcs.Items {
		in.RouteServices = append(in.RouteServices, &svcs.Items[i])
	}
	rc := r.routes.current()
	if rc == nil {
		in.RoutesUnavailable = true
		return nil
	}
	var routes servingv1alpha1.RouteList
	if err := rc.List(ctx, &routes); err != nil {
		// The Routes' cache is apart so that it never holds up the rest.
		r.opts.Log.Warn("redirect: list Routes; their addresses get no entry until the next sync", "err", err)
		in.RoutesUnavailable = true
		return nil
	}
	in.Routes = routes.Items
	for _, rt := range routes.Items {
		for _, tt := range rt.Status.Traffic {
			key := types.NamespacedName{Namespace: rt.Namespace, Name: tt.RevisionName}
			if _, done := in.Services[key]; done || tt.RevisionName == "" {
				continue
			}
			var svc corev1.Service
			if err := r.cache.Get(ctx, key, &svc); err == nil {
				in.Services[key] = &svc
			}
		}
	}
	return nil
}

// sync makes the kernel map equal to the desired state: against the map
// read back from the kernel when full (or when what it holds is unknown),
// else against what was last written.
func (r *Reconciler) sync(ctx context.Context, full bool) error {
	in, err := r.inputs(ctx)
	if err != nil {
		return err
	}
	return r.syncTo(Compute(in), full)
}

// syncTo is sync with the desired state computed.
func (r *Reconciler) syncTo(d Desired, full bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.targets = d.Targets
	r.metrics.setSkipped(d.Skipped)
	if full || r.applied == nil {
		got, err := r.opts.Map.Entries()
		if err != nil {
			r.metrics.errors.WithLabelValues(stageEntries).Inc()
			return fmt.Errorf("read the redirect map: %w", err)
		}
		r.applied = got
	}
	written, errs := r.apply(d)
	if full && len(errs) == 0 {
		// The map equals the cluster as the caches see it.
		if err := r.opts.Map.Renew(max(LeaseTTL, 3*r.opts.ResyncPeriod)); err != nil {
			r.metrics.errors.WithLabelValues(stageLease).Inc()
			errs = append(errs, fmt.Errorf("renew the redirect map's lease: %w", err))
		}
	}
	if full {
		errs = append(errs, r.forgetCounters(d))
	}
	r.metrics.setEntries(r.applied, d.Entries)
	r.observeLatencies(written)
	return errors.Join(errs...)
}

// apply writes the difference between r.applied and d.Entries, and returns
// the targets whose entries it changed (all writes succeeded) or failed to
// change.
func (r *Reconciler) apply(d Desired) (map[Target]bool, []error) {
	written := make(map[Target]bool)
	var errs []error
	note := func(key Target, op string, err error) {
		if err != nil {
			r.metrics.updates.WithLabelValues(op, resultError).Inc()
			errs = append(errs, err)
			written[key] = false
			return
		}
		r.metrics.updates.WithLabelValues(op, resultOK).Inc()
		if _, noted := written[key]; !noted {
			written[key] = true // a failure noted before stays false
		}
	}
	applied := r.applied
	// Sorted, so a log of the writes reads the same every time.
	for _, a := range slices.SortedFunc(maps.Keys(applied), netip.AddrPort.Compare) {
		if _, ok := d.Entries[a]; ok {
			continue
		}
		var err error
		if _, known := d.Targets[a]; known {
			err = r.opts.Map.Delete(a) // the Service stays: keep its counter
		} else {
			err = r.opts.Map.Forget(a) // nobody's Service: drop the counter too
		}
		if err == nil {
			delete(applied, a)
			r.opts.Log.Debug("redirect removed", "service", a, "target", d.Targets[a])
		}
		note(d.Targets[a], opDelete, err)
	}
	for _, a := range slices.SortedFunc(maps.Keys(d.Entries), netip.AddrPort.Compare) {
		e := d.Entries[a]
		if slices.Equal(applied[a], e.Backends) {
			continue
		}
		err := r.opts.Map.Set(a, e.Backends)
		if err == nil {
			applied[a] = e.Backends
			r.opts.Log.Debug("redirect set", "service", a, "target", e.Target, "backends", len(e.Backends))
		}
		note(e.Target, opSet, err)
	}
	if len(errs) > 0 {
		// A failed write leaves its entry unknown: read the map back
		// next time.
		r.applied = nil
	}
	return written, errs
}

// forgetCounters drops the redirected counters of addresses that are no
// target's any more (their entries are gone already), so the counter map
// does not fill with deleted Services.
func (r *Reconciler) forgetCounters(d Desired) error {
	counts, err := r.opts.Map.Redirected()
	if err != nil {
		r.metrics.errors.WithLabelValues(stageCounters).Inc()
		return fmt.Errorf("read the redirected counters: %w", err)
	}
	var errs []error
	for a := range counts {
		_, known := d.Targets[a]
		_, entry := d.Entries[a]
		if known || entry {
			continue
		}
		if err := r.opts.Map.Forget(a); err != nil {
			r.metrics.errors.WithLabelValues(stageForget).Inc()
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// observeLatencies records, for each ServerlessService whose status change
// was seen, how long until its entries were written; a change that needed
// no write is dropped, one whose write failed waits for the retry.
func (r *Reconciler) observeLatencies(written map[Target]bool) {
	now := r.opts.Clock.Now()
	for key, seen := range r.observed {
		ok, wrote := written[sksTarget(key)]
		switch {
		case !wrote:
			delete(r.observed, key)
		case ok:
			r.metrics.latency.Observe(now.Sub(seen).Seconds())
			delete(r.observed, key)
		}
	}
}

func (r *Reconciler) entryCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.applied)
}

// counters returns the redirected connects per address and the target of
// each, for the metrics.
func (r *Reconciler) counters() (map[netip.AddrPort]uint64, map[netip.AddrPort]Target, error) {
	counts, err := r.opts.Map.Redirected()
	r.mu.Lock()
	defer r.mu.Unlock()
	return counts, r.targets, err
}
