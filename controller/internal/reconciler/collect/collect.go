package collect

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
	"github.com/sockscale/sockscale/controller/internal/scaletarget"
)

// Resync is how often each PodAutoscaler is looked at again without an
// event, a safety net: a change of the autoscaler ConfigMap (re-read every
// 10 s, not watched) that may change the windows' length queues every
// PodAutoscaler at once (ConfigPoll), and a minute keeps thousands of
// targets cheap.
const Resync = time.Minute

// ConfigPoll is how often the configuration in force is compared with the
// one last seen, to look at every PodAutoscaler again when it changed: as
// often as the PodAutoscaler reconciler's tick, which reads it too.
const ConfigPoll = 2 * time.Second

// Reconciler tells the collector, for each PodAutoscaler, the settings its
// windows need (Watch) and which ready pods it should hear from (Expect),
// and makes it forget deleted ones. It is the only one that does: the
// PodAutoscaler reconciler reads the windows (a target not watched yet
// has no data) and never changes which targets are watched, so that a
// bucket moving away from this replica leaves its targets' windows warm.
// Every replica runs it, so a standby's windows are as warm as the
// leader's and a failover loses no history: the agents and activators
// report to every replica.
type Reconciler struct {
	Client    client.Client
	Collector *collector.Collector
	// Config returns the cluster defaults in force.
	Config func() *config.Config
	// ScaleTargetKinds are the kinds a PodAutoscaler may scale, as the
	// PodAutoscaler reconciler has them; nil: scaletarget.DefaultKinds.
	ScaleTargetKinds scaletarget.Kinds
	// MaxConcurrentReconciles is how many PodAutoscalers are looked at
	// at once (0: controller-runtime's default, 1); watched is under mu,
	// the collector locks itself.
	MaxConcurrentReconciles int

	mu sync.Mutex
	// watched maps each PodAutoscaler to the collector key it feeds (its
	// target's name), to forget the right one.
	watched map[client.ObjectKey]collector.Key
}

var _ reconcile.Reconciler = (*Reconciler)(nil)

// +kubebuilder:rbac:groups=sockscale.dev,resources=podautoscalers,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch

// Reconcile reads a PodAutoscaler, its Deployment (the pod template's
// annotations; a target of another kind is not read: the PodAutoscaler
// reconciler reads its /scale, which has no pod template) and its private
// Service's endpoints, and passes what it found to the collector.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var pa v1alpha1.PodAutoscaler
	if err := r.Client.Get(ctx, req.NamespacedName, &pa); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	ref := pa.Spec.ScaleTargetRef
	gvk, err := scaletarget.GroupVersionKind(ref)
	if err != nil || !r.ScaleTargetKinds.Allows(gvk.GroupKind()) {
		r.forget(req.NamespacedName) // the PodAutoscaler reconciler says why
		return ctrl.Result{}, nil
	}
	var settings config.Settings
	if gvk == appsv1.SchemeGroupVersion.WithKind("Deployment") {
		var d appsv1.Deployment
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: pa.Namespace, Name: ref.Name}, &d); err != nil {
			if apierrors.IsNotFound(err) {
				r.forget(req.NamespacedName)
				return ctrl.Result{RequeueAfter: Resync}, nil
			}
			return ctrl.Result{}, err
		}
		settings, err = config.ForPodAutoscaler(r.Config(), &pa, &d)
	} else {
		// Whether it exists is the PodAutoscaler reconciler's to say;
		// windows of a target that does not exist stay empty.
		settings, err = config.ForTarget(r.Config(), &pa, nil, ref.Kind+" "+ref.Name)
	}
	if err != nil {
		// The PodAutoscaler reconciler reports the bad setting; the windows
		// keep their last good shape meanwhile.
		log.FromContext(ctx).V(1).Info("invalid settings; windows unchanged", "error", err.Error())
		return ctrl.Result{RequeueAfter: Resync}, nil
	}
	// Agents name a pod's workload after its owner (a Deployment's for
	// its ReplicaSets' pods), which is the name the target is known by.
	key := collector.Key{Namespace: pa.Namespace, Name: ref.Name}
	r.remember(req.NamespacedName, key)
	if err := r.Collector.Watch(key, paKey(req.NamespacedName), settings); err != nil {
		return ctrl.Result{}, err
	}
	ready, all, err := Endpoints(ctx, r.Client, pa.Namespace, names.PrivateServiceName(pa.Spec.Service.Name))
	if err != nil {
		return ctrl.Result{}, err
	}
	r.Collector.Expect(key, ready)
	r.Collector.Members(key, all)
	return ctrl.Result{RequeueAfter: Resync}, nil
}

// ReadyPods are the ready endpoints of a Service's EndpointSlices (the
// private Service: the target's pods), each pod by the address the agents
// report it by (Endpoints), with their nodes ("" if a slice does not
// say).
func ReadyPods(ctx context.Context, c client.Reader, namespace, service string) (map[netip.Addr]string, error) {
	ready, _, err := Endpoints(ctx, c, namespace, service)
	return ready, err
}

// Endpoints are a Service's endpoints with their nodes: the ready ones
// (as ReadyPods), and all of them, not ready and terminating too (the
// pods whose stats an agent may send). A pod is there once, by the
// address agents report it by (package podaddr): a dual-stack pod is
// listed by an IPv4 and an IPv6 slice, and only its IPv4 address counts,
// or it would be expected twice and one of the two never heard. An
// endpoint that names no pod counts by each of its addresses.
func Endpoints(ctx context.Context, c client.Reader, namespace, service string) (ready, all map[netip.Addr]string, err error) {
	var list discoveryv1.EndpointSliceList
	if err := c.List(ctx, &list, client.InNamespace(namespace), client.MatchingLabels{discoveryv1.LabelServiceName: service}); err != nil {
		return nil, nil, fmt.Errorf("list EndpointSlices of %s: %w", service, err)
	}
	ready, all = make(map[netip.Addr]string), make(map[netip.Addr]string)
	// IPv4 slices first: a pod they list is known by that address.
	withIPv4 := make(map[string]bool)
	for _, family := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
		for _, s := range list.Items {
			if s.AddressType != family {
				continue
			}
			for _, e := range s.Endpoints {
				pod := ""
				if e.TargetRef != nil && e.TargetRef.Kind == "Pod" {
					pod = e.TargetRef.Name
				}
				if pod != "" && withIPv4[pod] {
					continue // its IPv6 address: the pod is known by its IPv4 one
				}
				isReady := ptr.Deref(e.Conditions.Ready, true) && !ptr.Deref(e.Conditions.Terminating, false)
				for _, a := range e.Addresses {
					ip, err := netip.ParseAddr(a)
					if err != nil {
						continue
					}
					all[ip.Unmap()] = ptr.Deref(e.NodeName, "")
					if isReady {
						ready[ip.Unmap()] = ptr.Deref(e.NodeName, "")
					}
					if family == discoveryv1.AddressTypeIPv4 && pod != "" {
						withIPv4[pod] = true
					}
				}
			}
		}
	}
	return ready, all, nil
}

func (r *Reconciler) remember(pa client.ObjectKey, key collector.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.watched == nil {
		r.watched = make(map[client.ObjectKey]collector.Key)
	}
	if old, ok := r.watched[pa]; ok && old != key {
		r.Collector.Forget(old, paKey(pa)) // the PodAutoscaler now points elsewhere
	}
	r.watched[pa] = key
}

// paKey names a PodAutoscaler as the collector's watcher.
func paKey(pa client.ObjectKey) collector.Key {
	return collector.Key{Namespace: pa.Namespace, Name: pa.Name}
}

func (r *Reconciler) forget(pa client.ObjectKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if key, ok := r.watched[pa]; ok {
		r.Collector.Forget(key, paKey(pa))
		delete(r.watched, pa)
	}
}

// Field indexes on PodAutoscalers (IndexFields): the map functions find
// the PodAutoscalers of a Deployment or EndpointSlice event in the cache's
// index, in O(matches), instead of listing the namespace's PodAutoscalers
// and testing each: with 10,000 of them in one namespace and every
// EndpointSlice of the cluster changing now and then (each pod start,
// stop and readiness flip), a List per event would copy 10,000 objects.
const (
	// IndexDeployment is the name of the Deployment a PodAutoscaler
	// scales (none for other kinds).
	IndexDeployment = "spec.scaleTargetRef.deployment"
	// IndexPrivateService is the name of its private Service.
	IndexPrivateService = "spec.service.private"
)

// DeploymentIndex is IndexDeployment's value of a PodAutoscaler.
func DeploymentIndex(o client.Object) []string {
	pa, ok := o.(*v1alpha1.PodAutoscaler)
	if !ok || pa.Spec.ScaleTargetRef.Kind != "Deployment" || pa.Spec.ScaleTargetRef.Name == "" {
		return nil
	}
	return []string{pa.Spec.ScaleTargetRef.Name}
}

// PrivateServiceIndex is IndexPrivateService's value of a PodAutoscaler.
func PrivateServiceIndex(o client.Object) []string {
	pa, ok := o.(*v1alpha1.PodAutoscaler)
	if !ok || pa.Spec.Service.Name == "" {
		return nil
	}
	return []string{names.PrivateServiceName(pa.Spec.Service.Name)}
}

// IndexFields registers IndexDeployment and IndexPrivateService with the
// manager's cache (before it starts).
func IndexFields(ctx context.Context, fi client.FieldIndexer) error {
	if err := fi.IndexField(ctx, &v1alpha1.PodAutoscaler{}, IndexDeployment, DeploymentIndex); err != nil {
		return fmt.Errorf("index PodAutoscalers by Deployment: %w", err)
	}
	if err := fi.IndexField(ctx, &v1alpha1.PodAutoscaler{}, IndexPrivateService, PrivateServiceIndex); err != nil {
		return fmt.Errorf("index PodAutoscalers by private Service: %w", err)
	}
	return nil
}

// SetupWithManager runs the reconciler on every replica (no leader
// election) for PodAutoscalers, their Deployments and their private
// Services' EndpointSlices, and registers the field indexes its map
// functions read.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := IndexFields(context.Background(), mgr.GetFieldIndexer()); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("podautoscaler-collector").
		// What it reads of a PodAutoscaler is its spec: the leader's status
		// writes (every change of a decision) need not wake every replica.
		For(&v1alpha1.PodAutoscaler{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&appsv1.Deployment{}, handler.EnqueueRequestsFromMapFunc(r.byDeployment)).
		Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(r.byPrivateService)).
		WatchesRawSource(r.configChanges(ConfigPoll)).
		WithOptions(controller.Options{NeedLeaderElection: ptr.To(false), MaxConcurrentReconciles: r.MaxConcurrentReconciles}).
		Complete(r)
}

// configChanges is a source that queues every PodAutoscaler when the
// configuration in force changes (compared every period): its windows'
// settings may have changed with it.
func (r *Reconciler) configChanges(period time.Duration) source.Source {
	return source.Func(func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		go func() {
			last := *r.Config()
			t := time.NewTicker(period)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				if cur := *r.Config(); cur != last {
					last = cur
					r.enqueueAll(ctx, q)
				}
			}
		}()
		return nil
	})
}

// enqueueAll queues every PodAutoscaler in the cache.
func (r *Reconciler) enqueueAll(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	var list v1alpha1.PodAutoscalerList
	if err := r.Client.List(ctx, &list); err != nil {
		// Resync brings the change within a minute anyway.
		log.FromContext(ctx).Error(err, "list PodAutoscalers after a configuration change")
		return
	}
	for i := range list.Items {
		q.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
}

// byDeployment maps a Deployment to the PodAutoscalers that scale it.
func (r *Reconciler) byDeployment(ctx context.Context, o client.Object) []reconcile.Request {
	return r.matching(ctx, o.GetNamespace(), IndexDeployment, o.GetName())
}

// byPrivateService maps an EndpointSlice to the PodAutoscalers whose
// private Service it belongs to.
func (r *Reconciler) byPrivateService(ctx context.Context, o client.Object) []reconcile.Request {
	service := o.GetLabels()[discoveryv1.LabelServiceName]
	if service == "" {
		return nil
	}
	return r.matching(ctx, o.GetNamespace(), IndexPrivateService, service)
}

// matching are the PodAutoscalers in ns whose field index has value.
func (r *Reconciler) matching(ctx context.Context, ns, index, value string) []reconcile.Request {
	var list v1alpha1.PodAutoscalerList
	if err := r.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingFields{index: value}); err != nil {
		log.FromContext(ctx).Error(err, "list PodAutoscalers by index", "index", index, "value", value)
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}
