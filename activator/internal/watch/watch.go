package watch

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/activator/internal/readiness"
	"github.com/sockscale/sockscale/activator/internal/resolve"
	"github.com/sockscale/sockscale/activator/internal/target"
	"github.com/sockscale/sockscale/activator/internal/throttle"
	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

// Where the activator's inputs live. PrivateSuffix is the controller's
// naming of a target's private Service (public name + "-private"; the
// controller's reconciler/names owns it, which the activator may not
// import); the EndpointSlice controller labels each slice with its
// Service's name.
const (
	PrivateSuffix    = "-private"
	serviceNameLabel = discoveryv1.LabelServiceName
	serviceNameField = "spec.service.name"
	h2cAppProtocol   = "kubernetes.io/h2c"
)

// Table is where targets are resolved from (resolve.Table).
type Table interface {
	Upsert(t target.Target) error
	// UpsertRouteService adds or replaces a Route's Service, replacing a
	// target of the same key.
	UpsertRouteService(s resolve.RouteService) error
	// Delete removes the Service k, a target's or a Route's.
	Delete(k target.Key)
	UpsertRoute(r resolve.Route)
	DeleteRoute(k target.Key)
}

// Throttle holds requests per target (throttle.Throttler).
type Throttle interface {
	Update(k target.Key, s throttle.Settings) error
	Delete(k target.Key)
}

// Pods keeps each target's ready pods (readiness.Prober).
type Pods interface {
	SetPods(k target.Key, pods []readiness.Pod)
	Delete(k target.Key)
}

// Watcher keeps the activator's view of its targets equal to the cluster:
// for each public Service that a PodAutoscaler names, the resolution table
// (addresses, ports, timeout, Proxy mode), the throttle's settings
// (containerConcurrency and the activators in the path, from the
// ServerlessService) and the pods of the private Service's EndpointSlices;
// and the serving API's Routes with their Services (servingroutes.go).
// Every event enqueues the Service or Route it concerns; a worker rebuilds
// that one from the cache, so the order in which objects arrive does not
// matter.
type Watcher struct {
	Cache    cache.Cache
	Table    Table
	Throttle Throttle
	Pods     Pods
	// Mapper tells whether the Gateway API is installed (HTTPRoutes are
	// watched only then); nil: HTTPRoutes are not watched.
	Mapper meta.RESTMapper
	// APIReader reads the API server without the cache: it tells whether
	// the serving API's Routes can be watched (their CRD installed, and
	// RBAC allowing list) before an informer would retry for ever. Nil:
	// Routes are not watched.
	APIReader client.Reader
	// RouteRetryPeriod is how often Routes are tried again while they
	// cannot be watched (0: DefaultRouteRetryPeriod).
	RouteRetryPeriod time.Duration
	// Registerer takes the watcher's metrics (nil: not registered).
	Registerer prometheus.Registerer
	Log        *slog.Logger

	queue  workqueue.TypedRateLimitingInterface[item]
	synced atomic.Bool
	// httpRoutes: HTTPRoutes are served, indexed and watched.
	httpRoutes bool
	// routes: serving Routes are watched.
	routes atomic.Bool
	// conflicts: route host claims ignored (claims).
	conflicts     *conflicts
	conflictsOnce sync.Once

	mu sync.RWMutex
	// workloads maps a target to its Deployment's name, for stats records.
	workloads map[target.Key]string
}

// Workload returns the name of the Deployment behind the target, as the
// controller's collector keys it.
func (w *Watcher) Workload(k target.Key) (string, bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	name, ok := w.workloads[k]
	return name, ok
}

// Synced says whether every target known at start has been synced once:
// until then a request could get a 404 for a target that exists, so the
// activator is not ready.
func (w *Watcher) Synced() bool { return w.synced.Load() }

// Run's informers: list and watch; Sync reads the cache, never the API.
// +kubebuilder:rbac:groups=sockscale.dev,resources=podautoscalers;serverlessservices,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=services,verbs=list;watch
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=list;watch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=ingresses,verbs=list;watch
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=httproutes,verbs=list;watch

// Index is a field index of the cache that Sync lists with.
type Index struct {
	Object  client.Object
	Field   string
	Extract client.IndexerFunc
}

// Indexes are the field indexes a reader given to Sync must have (Run
// adds them to the cache; a test's fake reader needs them too), but for
// HTTPRoutes' (added by Run only where the Gateway API is installed).
func Indexes() []Index {
	return []Index{
		{&v1alpha1.PodAutoscaler{}, serviceNameField, func(o client.Object) []string {
			return []string{o.(*v1alpha1.PodAutoscaler).Spec.Service.Name}
		}},
		{&networkingv1.Ingress{}, backendField, func(o client.Object) []string {
			return backendKeys(ingressBackends(o.(*networkingv1.Ingress)))
		}},
		{&networkingv1.Ingress{}, hostField, routeClaims},
	}
}

// HTTPRouteIndexes are the field indexes of HTTPRoutes, which Run adds
// where the Gateway API is installed.
func HTTPRouteIndexes() []Index {
	return []Index{
		{newHTTPRoute(), backendField, func(o client.Object) []string {
			return backendKeys(routeBackends(o.(*unstructured.Unstructured)))
		}},
		{newHTTPRoute(), hostField, routeClaims},
	}
}

// Run registers the watches, waits for the caches to fill, syncs every
// target once (then Synced is true), then follows changes until ctx ends.
// The cache must be started by the caller.
func (w *Watcher) Run(ctx context.Context) error {
	w.queue = workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[item]())
	defer w.queue.ShutDown()
	w.workloads = make(map[target.Key]string)
	for _, ix := range Indexes() {
		if err := w.Cache.IndexField(ctx, ix.Object, ix.Field, ix.Extract); err != nil {
			return fmt.Errorf("index %T by %s: %w", ix.Object, ix.Field, err)
		}
	}
	if w.Mapper != nil {
		served, err := httpRoutesServed(w.Mapper)
		if err != nil {
			return err
		}
		w.httpRoutes = served
	}
	if w.httpRoutes {
		for _, ix := range HTTPRouteIndexes() {
			if err := w.Cache.IndexField(ctx, ix.Object, ix.Field, ix.Extract); err != nil {
				return fmt.Errorf("index HTTPRoutes by %s: %w", ix.Field, err)
			}
		}
	}
	w.claims() // registers the metrics
	// Routes are watched from the start when they can be; otherwise the
	// activator serves public Services without them and tries again.
	routesNow := false
	if w.APIReader != nil {
		why := w.routesUnreadable(ctx)
		routesNow = why == ""
		if !routesNow {
			w.Log.Warn("serving Routes are not watched: requests for their hosts get 503 until they are; public Services are served as before; trying again periodically",
				"reason", why, "retryPeriod", w.retryPeriod())
		}
	}
	w.Log.Info("watching targets", "httpRoutes", w.httpRoutes, "routes", routesNow)
	routeEvent := func(o client.Object) []target.Key { return w.routeEventTargets(ctx, w.Cache, o) }
	watches := []struct {
		obj  client.Object
		keys func(client.Object) []target.Key
	}{
		{&v1alpha1.PodAutoscaler{}, func(o client.Object) []target.Key {
			pa := o.(*v1alpha1.PodAutoscaler)
			return []target.Key{{Namespace: pa.Namespace, Name: pa.Spec.Service.Name}}
		}},
		{&corev1.Service{}, func(o client.Object) []target.Key {
			keys := []target.Key{{Namespace: o.GetNamespace(), Name: o.GetName()}}
			// A private Service decides whose pods its slices are.
			if public, ok := strings.CutSuffix(o.GetName(), PrivateSuffix); ok && public != "" {
				keys = append(keys, target.Key{Namespace: o.GetNamespace(), Name: public})
			}
			return keys
		}},
		{&discoveryv1.EndpointSlice{}, func(o client.Object) []target.Key {
			public, ok := strings.CutSuffix(o.GetLabels()[serviceNameLabel], PrivateSuffix)
			if !ok || public == "" {
				return nil
			}
			return []target.Key{{Namespace: o.GetNamespace(), Name: public}}
		}},
		{&v1alpha1.ServerlessService{}, func(o client.Object) []target.Key {
			sks := o.(*v1alpha1.ServerlessService)
			return []target.Key{{Namespace: sks.Namespace, Name: sks.Spec.PublicService}}
		}},
		{&networkingv1.Ingress{}, routeEvent},
	}
	if w.httpRoutes {
		watches = append(watches, struct {
			obj  client.Object
			keys func(client.Object) []target.Key
		}{newHTTPRoute(), routeEvent})
	}
	for _, h := range watches {
		inf, err := w.Cache.GetInformer(ctx, h.obj)
		if err != nil {
			return fmt.Errorf("watch %T: %w", h.obj, err)
		}
		if _, err := inf.AddEventHandler(w.handler(services(h.keys))); err != nil {
			return fmt.Errorf("watch %T: %w", h.obj, err)
		}
	}
	// Pods are read, not watched for events: a pod's readiness probe
	// (podCheck) is fixed when it is created, seconds before it is an
	// endpoint. The informer starts here so the first sync does not wait
	// on it.
	if _, err := w.Cache.GetInformer(ctx, &corev1.Pod{}); err != nil {
		return fmt.Errorf("watch %T: %w", &corev1.Pod{}, err)
	}
	if routesNow {
		if err := w.watchRoutes(ctx); err != nil {
			return err
		}
	}
	if !w.Cache.WaitForCacheSync(ctx) {
		return fmt.Errorf("wait for the caches to sync: %w", context.Cause(ctx))
	}
	if err := w.syncAll(ctx); err != nil {
		return err
	}
	w.synced.Store(true)
	if w.APIReader != nil && !routesNow {
		go w.retryRoutes(ctx)
	}
	go func() {
		<-ctx.Done()
		w.queue.ShutDown()
	}()
	for w.next(ctx) {
	}
	return nil
}

// syncAll syncs every target a PodAutoscaler names, every Route's
// Service and every Route, in this goroutine; one that fails is left to
// the queue's retries.
func (w *Watcher) syncAll(ctx context.Context) error {
	var list v1alpha1.PodAutoscalerList
	if err := w.Cache.List(ctx, &list); err != nil {
		return fmt.Errorf("list PodAutoscalers: %w", err)
	}
	var items []item
	for i := range list.Items {
		items = append(items, item{key: target.Key{Namespace: list.Items[i].Namespace, Name: list.Items[i].Spec.Service.Name}})
	}
	if w.routes.Load() {
		more, err := w.routeItems(ctx)
		if err != nil {
			return err
		}
		items = append(items, more...)
	}
	for _, it := range items {
		if err := w.sync(ctx, it); err != nil {
			w.Log.Warn("sync; retrying", it.kind(), it.key.String(), "error", err)
			w.queue.AddRateLimited(it)
		}
	}
	return nil
}

// item is what the queue holds: a Service (a target's public Service or
// a Route's Service) or a serving Route, by key.
type item struct {
	key target.Key
	// route: a serving Route, not a Service.
	route bool
}

func (it item) kind() string {
	if it.route {
		return "route"
	}
	return "target"
}

// services makes the items of Services from an event's target keys.
func services(keys func(client.Object) []target.Key) func(client.Object) []item {
	return func(o client.Object) []item {
		var items []item
		for _, k := range keys(o) {
			items = append(items, item{key: k})
		}
		return items
	}
}

func (w *Watcher) sync(ctx context.Context, it item) error {
	if it.route {
		return w.SyncRoute(ctx, w.Cache, it.key)
	}
	return w.Sync(ctx, w.Cache, it.key)
}

// handler enqueues the items an object concerns, before and after an
// update (a PodAutoscaler may move from one Service to another).
func (w *Watcher) handler(items func(client.Object) []item) toolscache.ResourceEventHandler {
	add := func(obj any) {
		if o, ok := obj.(client.Object); ok {
			for _, it := range items(o) {
				if it.key.Namespace != "" && it.key.Name != "" {
					w.queue.Add(it)
				}
			}
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    add,
		UpdateFunc: func(old, obj any) { add(old); add(obj) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			add(obj)
		},
	}
}

// next syncs one queued target; false once the queue shuts down.
func (w *Watcher) next(ctx context.Context) bool {
	it, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	defer w.queue.Done(it)
	if err := w.sync(ctx, it); err != nil {
		w.Log.Warn("sync; retrying", it.kind(), it.key.String(), "error", err)
		w.queue.AddRateLimited(it)
		return true
	}
	w.queue.Forget(it)
	return true
}

// Sync makes the activator's view of the Service k equal to what r holds.
// A target is served while a PodAutoscaler names its public Service and
// that Service exists; otherwise it is removed (its held requests fail
// with throttle.ErrTargetRemoved and new ones get 404). A Service that no
// PodAutoscaler names but that is labelled with a Route is that Route's
// address (syncRouteService).
func (w *Watcher) Sync(ctx context.Context, r client.Reader, k target.Key) error {
	pa, err := w.autoscaler(ctx, r, k)
	if err != nil {
		return err
	}
	var svc corev1.Service
	if err := r.Get(ctx, types.NamespacedName{Namespace: k.Namespace, Name: k.Name}, &svc); apierrors.IsNotFound(err) {
		w.remove(k) // no Service: nothing can call it
		return nil
	} else if err != nil {
		return fmt.Errorf("get Service %s: %w", k, err)
	}
	if pa == nil {
		if svc.Labels[servingv1alpha1.RouteLabelKey] != "" {
			return w.syncRouteService(ctx, r, &svc)
		}
		w.remove(k)
		return nil
	}
	t, err := targetOf(pa, &svc)
	if err != nil {
		// The API server validated the PodAutoscaler; a bad target here is
		// a version skew worth a loud log, not a retry loop.
		w.Log.Error("target refused", "target", k.String(), "error", err)
		w.remove(k)
		return nil
	}
	// The ServerlessService counts only when it is this PodAutoscaler's:
	// the controller made it, with a controller reference to it.
	var sks *v1alpha1.ServerlessService
	var activators []string
	s := &v1alpha1.ServerlessService{}
	switch err := r.Get(ctx, types.NamespacedName{Namespace: pa.Namespace, Name: pa.Name}, s); {
	case err == nil && metav1.IsControlledBy(s, pa):
		sks = s
		activators = sks.Status.Activators
		// The mode in place (forced Proxy without ready pods included),
		// not the PodAutoscaler's wish: what decides where connects go.
		t.Proxy = sks.Status.Mode == v1alpha1.ModeProxy
		t.Serve = serving(sks)
	case err != nil && !apierrors.IsNotFound(err):
		return fmt.Errorf("get ServerlessService %s/%s: %w", pa.Namespace, pa.Name, err)
	}
	pods, err := w.podsOf(ctx, r, pa, sks, k, podPortName(pa, &svc))
	if err != nil {
		return err
	}
	// The prober speaks to the pods as the forwards do: a gRPC server
	// may answer nothing else.
	for i := range pods {
		pods[i].H2C = t.H2C
	}
	hosts, conflicts, err := w.routeHosts(ctx, r, k)
	if err != nil {
		return err
	}
	t.Hosts = hosts
	// The throttle learns the target before the table resolves it, so a
	// request that resolves always finds its queue; pods come last (the
	// throttle ignores pods of targets it does not know).
	if err := w.Throttle.Update(k, throttle.Settings{ContainerConcurrency: t.ContainerConcurrency, Activators: activators, QueueDepth: t.QueueDepth}); err != nil {
		return fmt.Errorf("throttle %s: %w", k, err)
	}
	if err := w.Table.Upsert(t); err != nil {
		return fmt.Errorf("resolve table %s: %w", k, err)
	}
	w.Pods.SetPods(k, pods)
	w.setConflicts(k, conflicts)
	w.mu.Lock()
	if w.workloads == nil { // Sync called without Run (a test's reader)
		w.workloads = make(map[target.Key]string)
	}
	w.workloads[k] = pa.Spec.ScaleTargetRef.Name
	w.mu.Unlock()
	return nil
}

// remove forgets k: the table first, so no new request resolves to it.
func (w *Watcher) remove(k target.Key) {
	w.Table.Delete(k)
	w.forgetTarget(k)
	w.setConflicts(k, nil)
}

// forgetTarget forgets all but the table's entry of target k.
func (w *Watcher) forgetTarget(k target.Key) {
	w.Throttle.Delete(k)
	w.Pods.Delete(k)
	w.mu.Lock()
	delete(w.workloads, k)
	w.mu.Unlock()
}

// autoscaler returns the PodAutoscaler that names k's Service, nil if none.
// Two naming one Service is a user error the controller also meets; the
// oldest wins here so the choice is stable.
func (w *Watcher) autoscaler(ctx context.Context, r client.Reader, k target.Key) (*v1alpha1.PodAutoscaler, error) {
	var list v1alpha1.PodAutoscalerList
	if err := r.List(ctx, &list, client.InNamespace(k.Namespace), client.MatchingFields{serviceNameField: k.Name}); err != nil {
		return nil, fmt.Errorf("list PodAutoscalers of Service %s: %w", k, err)
	}
	live := slices.DeleteFunc(list.Items, func(pa v1alpha1.PodAutoscaler) bool { return pa.DeletionTimestamp != nil })
	if len(live) == 0 {
		return nil, nil
	}
	slices.SortFunc(live, func(a, b v1alpha1.PodAutoscaler) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	if len(live) > 1 {
		w.Log.Warn("several PodAutoscalers name one Service; the oldest is used", "target", k.String(), "used", live[0].Name, "ignored", len(live)-1)
	}
	return &live[0], nil
}

// targetOf builds what the resolver and throttle need from the
// PodAutoscaler and its public Service.
func targetOf(pa *v1alpha1.PodAutoscaler, svc *corev1.Service) (target.Target, error) {
	t := target.Target{
		Key:                  target.Key{Namespace: svc.Namespace, Name: svc.Name},
		ContainerConcurrency: int(pa.Spec.ContainerConcurrency),
	}
	if s := pa.Spec.TimeoutSeconds; s != nil {
		t.Timeout = time.Duration(*s) * time.Second
	}
	t.ColdStartHeader = true
	if a := pa.Spec.Activator; a != nil {
		if a.ColdStartHeader != nil {
			t.ColdStartHeader = *a.ColdStartHeader
		}
		if a.QueueDepth != nil {
			t.QueueDepth = int(*a.QueueDepth)
		}
		if hc := a.HealthChecks; hc != nil {
			t.HealthChecks = &target.HealthChecks{Status: http.StatusOK}
			for _, p := range hc.Paths {
				t.HealthChecks.Paths = append(t.HealthChecks.Paths, string(p))
			}
			for _, ua := range hc.UserAgents {
				t.HealthChecks.UserAgents = append(t.HealthChecks.UserAgents, string(ua))
			}
			if hc.Status != nil {
				t.HealthChecks.Status = int(*hc.Status)
			}
		}
	}
	t.ClusterIPs = clusterIPs(svc)
	for _, p := range svc.Spec.Ports {
		if p.Protocol != "" && p.Protocol != corev1.ProtocolTCP {
			continue
		}
		t.Ports = append(t.Ports, uint16(p.Port))
		if p.AppProtocol != nil && *p.AppProtocol == h2cAppProtocol && (pa.Spec.Service.Port == 0 || p.Port == pa.Spec.Service.Port) {
			t.H2C = true
		}
	}
	return t, t.Validate()
}

// sksReady is the type of a ServerlessService's condition that says its
// public endpoints are in place (the controller's names.ConditionReady).
const sksReady = "Ready"

// serving says whether a client that connects to the target's public
// Service now reaches its pods: the ServerlessService is in Serve mode
// (its status), Ready (the public endpoints are written, with a ready pod
// at least) and not already asked for Proxy (its spec). A Serve forced
// while no activator is ready (spec Proxy) is not: the target goes back
// to Proxy as soon as one is.
func serving(sks *v1alpha1.ServerlessService) bool {
	return sks.Status.Mode == v1alpha1.ModeServe && sks.Spec.Mode == v1alpha1.ModeServe &&
		meta.IsStatusConditionTrue(sks.Status.Conditions, sksReady)
}

// clusterIPs are the Service's addresses ("None", headless, is none).
func clusterIPs(svc *corev1.Service) []netip.Addr {
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 && svc.Spec.ClusterIP != "" {
		ips = []string{svc.Spec.ClusterIP}
	}
	var out []netip.Addr
	for _, s := range ips {
		if ip, err := netip.ParseAddr(s); err == nil {
			out = append(out, ip)
		}
	}
	return out
}

// podPortName is the name of the public Service port that requests go to:
// the PodAutoscaler's spec.service.port, else the first. The private
// Service copies the public ports with their names, so its EndpointSlices
// carry the pods' port under the same name. The activator takes requests
// on one port, so a target serves one port through it.
func podPortName(pa *v1alpha1.PodAutoscaler, svc *corev1.Service) string {
	for _, p := range svc.Spec.Ports {
		if pa.Spec.Service.Port == 0 || p.Port == pa.Spec.Service.Port {
			return p.Name
		}
	}
	return ""
}

// endpointSliceController is the managed-by label value of the slices
// Kubernetes computes from a Service's selector.
const endpointSliceController = "endpointslice-controller.k8s.io"

// podsOf lists the target's pods: the addresses Kubernetes computed for
// the target's own private Service, and nothing else. A tenant can name a
// Service or label a slice as it likes, so a name or label alone proves
// nothing (a public Service called "x-private" gets slices of activators
// labelled "x-private" in Proxy mode; forwarding to those loops a request
// between the activators). So the chain is checked by ownership: the
// private Service must be controlled by the target's ServerlessService
// (which must be controlled by its PodAutoscaler: the caller's check), and
// each slice must be the EndpointSlice controller's and controlled by that
// Service. No ServerlessService yet, or a private Service that is not its
// own (the controller reports NotOwned then): no pods, and requests wait.
func (w *Watcher) podsOf(ctx context.Context, r client.Reader, pa *v1alpha1.PodAutoscaler, sks *v1alpha1.ServerlessService, k target.Key, portName string) ([]readiness.Pod, error) {
	if sks == nil {
		return nil, nil
	}
	var private corev1.Service
	if err := r.Get(ctx, types.NamespacedName{Namespace: k.Namespace, Name: k.Name + PrivateSuffix}, &private); apierrors.IsNotFound(err) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("get Service %s%s: %w", k, PrivateSuffix, err)
	}
	if !metav1.IsControlledBy(&private, sks) {
		w.Log.Warn("the private Service is not the ServerlessService's; its endpoints are not taken as the target's pods",
			"target", k.String(), "service", private.Name, "serverlessService", sks.Name, "podAutoscaler", pa.Name)
		return nil, nil
	}
	var list discoveryv1.EndpointSliceList
	if err := r.List(ctx, &list, client.InNamespace(k.Namespace), client.MatchingLabels{serviceNameLabel: private.Name}); err != nil {
		return nil, fmt.Errorf("list EndpointSlices of %s%s: %w", k, PrivateSuffix, err)
	}
	list.Items = slices.DeleteFunc(list.Items, func(s discoveryv1.EndpointSlice) bool {
		return s.Labels[discoveryv1.LabelManagedBy] != endpointSliceController || !metav1.IsControlledBy(&s, &private)
	})
	return slicePods(list.Items, portName, func(name string, port uint16) *readiness.Check {
		var pod corev1.Pod
		if err := r.Get(ctx, types.NamespacedName{Namespace: k.Namespace, Name: name}, &pod); err != nil {
			// Not in the cache yet (or gone): probed as an unknown pod.
			return nil
		}
		return podCheck(&pod, port)
	}), nil
}

// podCheck is how the activator checks that pod serves on port before
// its EndpointSlice says so: the readiness probe of the container that
// serves port (the one declaring it, else the only container) when it is
// an httpGet over plain HTTP, at its path and port on the pod's address
// (never its host: a tenant's pod spec must not aim the activator's
// probes elsewhere); otherwise a TCP connection to port, which is what
// the kubelet checks by default for a serving container (a Knative
// Revision's default readiness). The target's own path (/) is never
// probed: see readiness.Check.
func podCheck(pod *corev1.Pod, port uint16) *readiness.Check {
	tcp := &readiness.Check{Port: port}
	var c *corev1.Container
	for i := range pod.Spec.Containers {
		for _, p := range pod.Spec.Containers[i].Ports {
			if p.ContainerPort == int32(port) {
				c = &pod.Spec.Containers[i]
			}
		}
	}
	if c == nil && len(pod.Spec.Containers) == 1 {
		c = &pod.Spec.Containers[0]
	}
	if c == nil || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil {
		return tcp
	}
	g := c.ReadinessProbe.HTTPGet
	if g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP {
		return tcp
	}
	probePort := g.Port.IntValue()
	if g.Port.Type == intstr.String {
		probePort = 0
		for _, p := range c.Ports {
			if p.Name == g.Port.StrVal {
				probePort = int(p.ContainerPort)
			}
		}
	}
	if probePort <= 0 || probePort > 65535 {
		return tcp
	}
	path := g.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	check := &readiness.Check{HTTP: true, Port: uint16(probePort), Path: path}
	for _, h := range g.HTTPHeaders {
		if check.Header == nil {
			check.Header = http.Header{}
		}
		check.Header.Add(h.Name, h.Value)
	}
	return check
}

// slicePods are the pods of the slices: every address not terminating,
// IPv4 and IPv6, with the slice's ready condition (the prober checks the
// others itself). A dual-stack pod is listed by an IPv4 slice and an
// IPv6 one: it is one destination, its IPv4 address, or its
// containerConcurrency would be granted twice. Endpoints are matched to
// pods by their targetRef: an IPv6 endpoint of a pod that an IPv4
// endpoint lists is left out; one that names no pod is a destination
// per address.
//
// check, if set, gives a pod's own readiness check (podCheck) by its name
// and the port.
func slicePods(items []discoveryv1.EndpointSlice, portName string, check func(pod string, port uint16) *readiness.Check) []readiness.Pod {
	seen := make(map[netip.AddrPort]int)
	// withIPv4 are the pods IPv4 endpoints list.
	withIPv4 := make(map[string]bool)
	var pods []readiness.Pod
	for _, family := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
		for i := range items {
			s := &items[i]
			if s.AddressType != family {
				continue
			}
			port, ok := slicePort(s, portName)
			if !ok {
				continue
			}
			for _, ep := range s.Endpoints {
				pod := endpointPod(&ep)
				switch {
				case pod != "" && family == discoveryv1.AddressTypeIPv4:
					withIPv4[pod] = true
				case pod != "" && withIPv4[pod]:
					continue // known by its IPv4 address
				}
				if ep.Conditions.Terminating != nil && *ep.Conditions.Terminating {
					continue
				}
				ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
				for _, a := range ep.Addresses {
					ip, err := netip.ParseAddr(a)
					if err != nil || !ofFamily(ip, family) {
						continue
					}
					ap := netip.AddrPortFrom(ip, port)
					// A pod may appear in two slices while the controller
					// moves it; ready in either is ready.
					if j, dup := seen[ap]; dup {
						pods[j].Ready = pods[j].Ready || ready
						continue
					}
					seen[ap] = len(pods)
					var c *readiness.Check
					if check != nil && pod != "" {
						c = check(pod, port)
					}
					pods = append(pods, readiness.Pod{Addr: ap, Ready: ready, Check: c})
				}
			}
		}
	}
	slices.SortFunc(pods, func(a, b readiness.Pod) int { return a.Addr.Compare(b.Addr) })
	return pods
}

// endpointPod is the name of the pod ep is, "" when it names none.
func endpointPod(ep *discoveryv1.Endpoint) string {
	if ep.TargetRef == nil || (ep.TargetRef.Kind != "" && ep.TargetRef.Kind != "Pod") {
		return ""
	}
	return ep.TargetRef.Name
}

// ofFamily says whether ip is an address of the slice family: IPv4 for
// IPv4, IPv6 for IPv6, neither IPv4-mapped IPv6 (which would reach an
// IPv4 address through an IPv6 slice) nor with a zone.
func ofFamily(ip netip.Addr, family discoveryv1.AddressType) bool {
	if family == discoveryv1.AddressTypeIPv4 {
		return ip.Is4()
	}
	return ip.Is6() && !ip.Is4In6() && ip.Zone() == ""
}

// slicePort is the slice's port named name (the only port when the
// Service has one unnamed port).
func slicePort(s *discoveryv1.EndpointSlice, name string) (uint16, bool) {
	for _, p := range s.Ports {
		if p.Port == nil || (p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP) {
			continue
		}
		n := ""
		if p.Name != nil {
			n = *p.Name
		}
		if n == name && *p.Port > 0 && *p.Port <= 65535 {
			return uint16(*p.Port), true
		}
	}
	return 0, false
}
