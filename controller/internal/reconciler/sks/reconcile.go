package sks

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/bucket"
	"github.com/sockscale/sockscale/controller/internal/endpoints"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
	"github.com/sockscale/sockscale/controller/internal/socketlayer"
)

// Labels and names of the objects the ServerlessService reconciler owns.
const (
	// ManagedBy is the endpointslice.kubernetes.io/managed-by value of the
	// public Service's EndpointSlices: Kubernetes' own controller leaves
	// slices of another manager alone.
	ManagedBy = "controller.sockscale.dev"
	// LabelServerlessService names the ServerlessService on its objects.
	LabelServerlessService = "sockscale.dev/serverlessservice"
	// AnnotationHandedBack on a public Service says that sockscale's
	// uninstall gave it its target's selector (value: the
	// ServerlessService), so that Kubernetes lists the pods without
	// sockscale. A later install removes that selector again and takes
	// the Service over; a selector without it is the user's, and refused.
	AnnotationHandedBack = "sockscale.dev/handed-back"
	// maxSliceEndpoints is Kubernetes' own limit per EndpointSlice.
	maxSliceEndpoints = 1000
)

// Reasons of a ServerlessService's Ready condition besides the modes'
// (endpoints.Reason*) and names.ReasonNotOwned.
const (
	ReasonPublicServiceNotFound    = "PublicServiceNotFound"
	ReasonPublicServiceHasSelector = "PublicServiceHasSelector"
	ReasonNoEndpoints              = "NoEndpoints"
)

// ServerlessService reconciles ServerlessServices: the private Service
// (the target's selector, so Kubernetes lists its pods) and the public
// Service's EndpointSlices (the pods in Serve mode, activators in Proxy).
type ServerlessService struct {
	Client client.Client
	// ActivatorNamespace ("" for all) and ActivatorSelector find the
	// activator pods; ActivatorPort is where they take proxied requests.
	ActivatorNamespace string
	ActivatorSelector  labels.Selector
	ActivatorPort      int32
	// SocketLayer holds the agents' node states for the SocketLayer
	// condition, and SocketLayerChanged says when they changed; nil
	// leaves the condition out.
	SocketLayer        *socketlayer.Tracker
	SocketLayerChanged <-chan event.GenericEvent
	// MaxConcurrentReconciles is how many ServerlessServices are
	// reconciled at once (0: controller-runtime's default, 1). Reconcile
	// keeps no state of its own; SocketLayer locks itself.
	MaxConcurrentReconciles int
	// Buckets, if set, are the targets (by the Deployment they scale)
	// whose ServerlessServices this replica reconciles: the reconciler
	// then runs on every replica, leader or not. Nil: every one, on the
	// leader.
	Buckets *bucket.Set
}

var _ reconcile.Reconciler = (*ServerlessService)(nil)

// +kubebuilder:rbac:groups=sockscale.dev,resources=serverlessservices,verbs=get;list;watch
// +kubebuilder:rbac:groups=sockscale.dev,resources=podautoscalers,verbs=get;list;watch
// +kubebuilder:rbac:groups=sockscale.dev,resources=serverlessservices/status,verbs=update
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups="",resources=endpoints,verbs=delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch

// Reconcile puts one ServerlessService's mode in place.
func (r *ServerlessService) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	leave, owned := r.Buckets.Enter(req.Namespace, r.scaleTarget(ctx, req.Namespace, req.Name))
	if !owned {
		return ctrl.Result{}, nil // another replica's bucket now
	}
	defer leave() // the bucket is not handed over while this writes
	var sks v1alpha1.ServerlessService
	if err := r.Client.Get(ctx, req.NamespacedName, &sks); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	status := sks.Status.DeepCopy()
	status.ObservedGeneration = sks.Generation
	status.ServiceName = sks.Spec.PublicService
	status.PrivateServiceName = names.PrivateServiceName(sks.Spec.PublicService)
	// found stays nil until the public Service is read: the SocketLayer
	// condition of a missing Service says so.
	public, found := &corev1.Service{}, (*corev1.Service)(nil)
	// activators stay nil until read: the SocketLayer condition checks
	// their families only then.
	var activators []endpoints.Endpoint
	notReady := func(reason, msg string) (ctrl.Result, error) {
		setSKSCondition(status, sks.Generation, metav1.ConditionFalse, reason, msg)
		r.setSocketLayer(status, &sks, found, activators)
		return ctrl.Result{}, r.writeStatus(ctx, &sks, status)
	}

	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: sks.Namespace, Name: sks.Spec.PublicService}, public); err != nil {
		if apierrors.IsNotFound(err) {
			// Its slices would outlive it and hand a Service created later
			// under the name stale endpoints (gone pods, activators).
			if err := r.deleteOwnSlices(ctx, &sks, sks.Spec.PublicService); err != nil {
				return ctrl.Result{}, err
			}
			return notReady(ReasonPublicServiceNotFound, fmt.Sprintf("Service %q does not exist in namespace %q; create it without a selector (its endpoints are written by sockscale); sockscale keeps no EndpointSlices for it meanwhile (those it wrote are deleted)", sks.Spec.PublicService, sks.Namespace))
		}
		return ctrl.Result{}, err
	}
	found = public
	if took, err := r.takeBack(ctx, &sks, public); err != nil || took {
		// The update enqueues this ServerlessService again.
		return ctrl.Result{}, err
	}
	if len(public.Spec.Selector) > 0 {
		// Kubernetes writes the endpoints now; sockscale's slices beside
		// its own would send part of the traffic to stale addresses.
		if err := r.deleteOwnSlices(ctx, &sks, public.Name); err != nil {
			return ctrl.Result{}, err
		}
		return notReady(ReasonPublicServiceHasSelector, fmt.Sprintf("Service %q has a selector, so Kubernetes writes its endpoints (sockscale's EndpointSlices of it are deleted); remove spec.selector (sockscale selects the pods through Service %q) to let sockscale switch it between pods and activators", public.Name, status.PrivateServiceName))
	}
	if msg, err := r.ensurePrivate(ctx, &sks, public); err != nil || msg != "" {
		if err != nil {
			return ctrl.Result{}, err
		}
		return notReady(names.ReasonNotOwned, msg)
	}
	podSlices, err := r.podSlices(ctx, sks.Namespace, status.PrivateServiceName, endpoints.Families(public))
	if err != nil {
		return ctrl.Result{}, err
	}
	activators, err = r.activators(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	res := endpoints.Public(endpoints.Inputs{
		Want: sks.Spec.Mode, WantReason: sks.Spec.ModeReason, Pods: readyEndpoints(podSlices), Activators: activators,
		NumActivators: sks.Spec.NumActivators, Target: sks.Namespace + "/" + sks.Name,
	})
	want := podSlices
	status.Activators = nil
	if res.Mode == v1alpha1.ModeServe {
		want = r.activatorsForPodlessFamilies(public, sks.Spec.Port, activators, podSlices)
	}
	if res.Mode == v1alpha1.ModeProxy {
		want = r.proxySlices(public, sks.Spec.Port, res.Endpoints, podSlices)
		for _, e := range res.Endpoints {
			status.Activators = append(status.Activators, e.Name)
		}
	}
	if msg, err := r.writeSlices(ctx, &sks, public, want); err != nil || msg != "" {
		if err != nil {
			return ctrl.Result{}, err
		}
		return notReady(names.ReasonNotOwned, msg)
	}
	status.Mode, status.ModeReason = res.Mode, res.Reason
	if len(res.Endpoints) == 0 {
		if res.Mode == v1alpha1.ModeProxy {
			return notReady(ReasonNoEndpoints, "no activator is ready, and the target's containerConcurrency is kept only by the activators: its pods are not put behind the public Service, where nothing would hold them to it; requests to the public Service fail until an activator is ready")
		}
		return notReady(ReasonNoEndpoints, "the target has no ready pod and no activator is ready: requests to the public Service fail until one is")
	}
	setSKSCondition(status, sks.Generation, metav1.ConditionTrue, res.Reason, fmt.Sprintf("%s: %d public endpoints", res.Mode, len(res.Endpoints)))
	r.setSocketLayer(status, &sks, public, activators)
	return ctrl.Result{}, r.writeStatus(ctx, &sks, status)
}

// SetupWithManager watches ServerlessServices, the Services they name and
// those Services' EndpointSlices, and the activator pods.
func (r *ServerlessService) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &v1alpha1.ServerlessService{}, IndexService, ServiceIndex); err != nil {
		return fmt.Errorf("index ServerlessServices by Service: %w", err)
	}
	opts := controller.Options{MaxConcurrentReconciles: r.MaxConcurrentReconciles}
	b := ctrl.NewControllerManagedBy(mgr)
	if r.SocketLayerChanged != nil {
		b = b.WatchesRawSource(source.Channel(r.SocketLayerChanged, handler.EnqueueRequestsFromMapFunc(r.all)))
	}
	if r.Buckets != nil {
		opts.NeedLeaderElection = ptr.To(false)
		b = b.WatchesRawSource(r.Buckets.Resync(r.ownedKeys, mgr.GetLogger().WithName("serverlessservice")))
	}
	return b.
		For(&v1alpha1.ServerlessService{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return r.owns(context.Background(), o.GetNamespace(), o.GetName())
		}))).
		// What it owns is found by name: the private Service and the
		// public Service's slices map back through naming.
		Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(r.byServiceLabel)).
		// Every event, deletion and selector change included: those
		// remove sockscale's slices of the public Service.
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(r.byServiceName)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.allForActivator)).
		WithOptions(opts).
		Complete(r)
}

// owns tells whether the ServerlessService namespace/name is this
// replica's: whether it holds the bucket of its scale target.
func (r *ServerlessService) owns(ctx context.Context, namespace, name string) bool {
	if r.Buckets == nil {
		return true
	}
	return r.Buckets.Owns(namespace, r.scaleTarget(ctx, namespace, name))
}

// noDeepCopy reads an object from the cache without copying it: for a
// field read and nothing else (an activator pod's change asks for every
// ServerlessService's owner).
var noDeepCopy = &client.GetOptions{UnsafeDisableDeepCopy: ptr.To(true)}

// scaleTarget names the Deployment whose bucket the ServerlessService
// namespace/name is in: the one its PodAutoscaler (of the same name)
// scales. Without the PodAutoscaler (being deleted, the ServerlessService
// with it), its own name stands in. "" without buckets (not needed).
func (r *ServerlessService) scaleTarget(ctx context.Context, namespace, name string) string {
	if r.Buckets == nil {
		return ""
	}
	var pa v1alpha1.PodAutoscaler
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &pa, noDeepCopy); err == nil {
		return pa.Spec.ScaleTargetRef.Name
	}
	return name
}

// ownedKeys names the ServerlessServices in the cache this replica owns.
func (r *ServerlessService) ownedKeys(ctx context.Context) ([]types.NamespacedName, error) {
	var list v1alpha1.ServerlessServiceList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil, err
	}
	var keys []types.NamespacedName
	for i := range list.Items {
		if r.owns(ctx, list.Items[i].Namespace, list.Items[i].Name) {
			keys = append(keys, client.ObjectKeyFromObject(&list.Items[i]))
		}
	}
	return keys, nil
}

// byServiceLabel maps an EndpointSlice to the ServerlessServices whose
// public or private Service it belongs to.
func (r *ServerlessService) byServiceLabel(ctx context.Context, o client.Object) []reconcile.Request {
	return r.naming(ctx, o.GetNamespace(), o.GetLabels()[discoveryv1.LabelServiceName])
}

func (r *ServerlessService) byServiceName(ctx context.Context, o client.Object) []reconcile.Request {
	return r.naming(ctx, o.GetNamespace(), o.GetName())
}

// IndexService is a field index of ServerlessServices: the names of
// their public and private Services. Every Service and EndpointSlice
// event of the cluster is mapped through it, in O(matches) rather than a
// List of the namespace's ServerlessServices (10,000 at 10,000 targets).
const IndexService = "spec.publicService.services"

// ServiceIndex is IndexService's values of a ServerlessService.
func ServiceIndex(o client.Object) []string {
	s, ok := o.(*v1alpha1.ServerlessService)
	if !ok || s.Spec.PublicService == "" {
		return nil
	}
	return []string{s.Spec.PublicService, names.PrivateServiceName(s.Spec.PublicService)}
}

// naming lists the ServerlessServices in ns whose public or private
// Service is service.
func (r *ServerlessService) naming(ctx context.Context, ns, service string) []reconcile.Request {
	if service == "" {
		return nil
	}
	var list v1alpha1.ServerlessServiceList
	if err := r.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingFields{IndexService: service}); err != nil {
		log.FromContext(ctx).Error(err, "list ServerlessServices by Service", "service", service)
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		if r.owns(ctx, list.Items[i].Namespace, list.Items[i].Name) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return out
}

// allForActivator enqueues every ServerlessService when an activator pod
// changes: any of them may have it in its subset.
func (r *ServerlessService) allForActivator(ctx context.Context, o client.Object) []reconcile.Request {
	if (r.ActivatorNamespace != "" && o.GetNamespace() != r.ActivatorNamespace) || !r.ActivatorSelector.Matches(labels.Set(o.GetLabels())) {
		return nil
	}
	return r.all(ctx, o)
}

// all enqueues every ServerlessService.
func (r *ServerlessService) all(ctx context.Context, _ client.Object) []reconcile.Request {
	var list v1alpha1.ServerlessServiceList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for _, s := range list.Items {
		if r.owns(ctx, s.Namespace, s.Name) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&s)})
		}
	}
	return out
}

// takeBack removes the selector an uninstall gave the public Service
// (AnnotationHandedBack) when it is still the target's: sockscale runs
// again and writes the Service's endpoints itself. Kubernetes' slices of
// that selector are then leftovers, which writeSlices removes.
func (r *ServerlessService) takeBack(ctx context.Context, sks *v1alpha1.ServerlessService, public *corev1.Service) (bool, error) {
	if _, ok := public.Annotations[AnnotationHandedBack]; !ok || !equality.Semantic.DeepEqual(public.Spec.Selector, sks.Spec.Selector) {
		return false, nil
	}
	public.Spec.Selector = nil
	delete(public.Annotations, AnnotationHandedBack)
	if err := r.Client.Update(ctx, public); err != nil {
		return false, fmt.Errorf("take Service %s back from Kubernetes (remove the selector sockscale's uninstall set): %w", public.Name, err)
	}
	log.FromContext(ctx).Info("took the public Service back: removed the selector an uninstall had given it", "service", public.Name)
	return true, nil
}
