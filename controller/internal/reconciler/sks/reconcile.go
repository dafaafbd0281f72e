package sks

import (
	"context"
	"fmt"
	"net/netip"
	"sort"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sockscale/sockscale/controller/api/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/endpoints"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
)

// Labels and names of the objects the ServerlessService reconciler owns.
const (
	// ManagedBy is the endpointslice.kubernetes.io/managed-by value of the
	// public Service's EndpointSlices: Kubernetes' own controller leaves
	// slices of another manager alone.
	ManagedBy = "controller.sockscale.dev"
	// LabelServerlessService names the ServerlessService on its objects.
	LabelServerlessService = "sockscale.dev/serverlessservice"
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
}

var _ reconcile.Reconciler = (*ServerlessService)(nil)

// +kubebuilder:rbac:groups=sockscale.dev,resources=serverlessservices,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=sockscale.dev,resources=serverlessservices/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch

// Reconcile puts one ServerlessService's mode in place.
func (r *ServerlessService) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var sks v1alpha1.ServerlessService
	if err := r.Client.Get(ctx, req.NamespacedName, &sks); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	status := sks.Status.DeepCopy()
	status.ObservedGeneration = sks.Generation
	status.ServiceName = sks.Spec.PublicService
	status.PrivateServiceName = names.PrivateServiceName(sks.Spec.PublicService)
	notReady := func(reason, msg string) (ctrl.Result, error) {
		setSKSCondition(status, sks.Generation, metav1.ConditionFalse, reason, msg)
		return ctrl.Result{}, r.writeStatus(ctx, &sks, status)
	}

	var public corev1.Service
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: sks.Namespace, Name: sks.Spec.PublicService}, &public); err != nil {
		if apierrors.IsNotFound(err) {
			return notReady(ReasonPublicServiceNotFound, fmt.Sprintf("Service %q does not exist in namespace %q; create it without a selector (its endpoints are written by sockscale)", sks.Spec.PublicService, sks.Namespace))
		}
		return ctrl.Result{}, err
	}
	if len(public.Spec.Selector) > 0 {
		return notReady(ReasonPublicServiceHasSelector, fmt.Sprintf("Service %q has a selector, so Kubernetes writes its endpoints; remove spec.selector (sockscale selects the pods through Service %q) to let sockscale switch it between pods and activators", public.Name, status.PrivateServiceName))
	}
	if msg, err := r.ensurePrivate(ctx, &sks, &public); err != nil || msg != "" {
		if err != nil {
			return ctrl.Result{}, err
		}
		return notReady(names.ReasonNotOwned, msg)
	}
	podSlices, err := r.readySlices(ctx, sks.Namespace, status.PrivateServiceName)
	if err != nil {
		return ctrl.Result{}, err
	}
	activators, err := r.activators(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	res := endpoints.Public(endpoints.Inputs{
		Want: sks.Spec.Mode, Pods: endpointsOf(podSlices), Activators: activators,
		NumActivators: sks.Spec.NumActivators, Target: sks.Namespace + "/" + sks.Name,
	})
	want := podSlices
	status.Activators = nil
	if res.Mode == v1alpha1.ModeProxy {
		want = []discoveryv1.EndpointSlice{r.activatorSlice(&public, res.Endpoints)}
		for _, e := range res.Endpoints {
			status.Activators = append(status.Activators, e.Name)
		}
	}
	if msg, err := r.writeSlices(ctx, &sks, &public, want); err != nil || msg != "" {
		if err != nil {
			return ctrl.Result{}, err
		}
		return notReady(names.ReasonNotOwned, msg)
	}
	status.Mode = res.Mode
	if len(res.Endpoints) == 0 {
		return notReady(ReasonNoEndpoints, "the target has no ready pod and no activator is ready: requests to the public Service fail until one is")
	}
	setSKSCondition(status, sks.Generation, metav1.ConditionTrue, res.Reason, fmt.Sprintf("%s: %d public endpoints", res.Mode, len(res.Endpoints)))
	return ctrl.Result{}, r.writeStatus(ctx, &sks, status)
}

// ensurePrivate creates or updates the private Service: the public one's
// ports with the target's selector. It returns a message instead when a
// Service of that name belongs to someone else.
func (r *ServerlessService) ensurePrivate(ctx context.Context, sks *v1alpha1.ServerlessService, public *corev1.Service) (string, error) {
	want := corev1.ServiceSpec{Selector: sks.Spec.Selector}
	for _, p := range public.Spec.Ports {
		want.Ports = append(want.Ports, corev1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, TargetPort: p.TargetPort, AppProtocol: p.AppProtocol})
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: sks.Namespace, Name: names.PrivateServiceName(public.Name)}}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(svc), svc)
	switch {
	case apierrors.IsNotFound(err):
		svc.Labels = map[string]string{LabelServerlessService: sks.Name, "app.kubernetes.io/managed-by": "sockscale"}
		svc.Spec = want
		if err := controllerutil.SetControllerReference(sks, svc, r.Client.Scheme()); err != nil {
			return "", err
		}
		return "", r.Client.Create(ctx, svc)
	case err != nil:
		return "", err
	case !metav1.IsControlledBy(svc, sks):
		return fmt.Sprintf("Service %q exists and is not managed by this ServerlessService; rename or delete it so sockscale can select the target's pods through it", svc.Name), nil
	}
	if equality.Semantic.DeepEqual(svc.Spec.Selector, want.Selector) && samePorts(svc.Spec.Ports, want.Ports) {
		return "", nil
	}
	svc.Spec.Selector, svc.Spec.Ports = want.Selector, want.Ports
	return "", r.Client.Update(ctx, svc)
}

// samePorts compares what ensurePrivate sets (the API server fills
// defaults such as the protocol and target port on the live object).
func samePorts(have, want []corev1.ServicePort) bool {
	if len(have) != len(want) {
		return false
	}
	for i := range want {
		h, w := have[i], want[i]
		if h.Name != w.Name || h.Port != w.Port || (w.Protocol != "" && h.Protocol != w.Protocol) ||
			(w.TargetPort.String() != "0" && h.TargetPort != w.TargetPort) {
			return false
		}
	}
	return true
}

// readySlices are the private Service's EndpointSlices with only their
// ready endpoints, in name order.
func (r *ServerlessService) readySlices(ctx context.Context, ns, service string) ([]discoveryv1.EndpointSlice, error) {
	var list discoveryv1.EndpointSliceList
	if err := r.Client.List(ctx, &list, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: service}); err != nil {
		return nil, fmt.Errorf("list EndpointSlices of %s: %w", service, err)
	}
	var out []discoveryv1.EndpointSlice
	for _, s := range list.Items {
		if s.AddressType != discoveryv1.AddressTypeIPv4 {
			continue // the agents account IPv4 pods (README: limitations)
		}
		ready := discoveryv1.EndpointSlice{AddressType: s.AddressType, Ports: s.Ports}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				ready.Endpoints = append(ready.Endpoints, discoveryv1.Endpoint{Addresses: e.Addresses, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}, TargetRef: e.TargetRef, NodeName: e.NodeName, Zone: e.Zone})
			}
		}
		if len(ready.Endpoints) > 0 {
			ready.Name = s.Name
			out = append(out, ready)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// endpointsOf flattens slices for the mode decision.
func endpointsOf(slices []discoveryv1.EndpointSlice) []endpoints.Endpoint {
	var out []endpoints.Endpoint
	for _, s := range slices {
		for _, e := range s.Endpoints {
			name := ""
			if e.TargetRef != nil {
				name = e.TargetRef.Name
			}
			for _, a := range e.Addresses {
				if ip, err := netip.ParseAddr(a); err == nil {
					out = append(out, endpoints.Endpoint{Name: name, IP: ip})
				}
			}
		}
	}
	return out
}

// activators are the ready activator pods.
func (r *ServerlessService) activators(ctx context.Context) ([]endpoints.Endpoint, error) {
	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(r.ActivatorNamespace), client.MatchingLabelsSelector{Selector: r.ActivatorSelector}); err != nil {
		return nil, fmt.Errorf("list activator pods: %w", err)
	}
	var out []endpoints.Endpoint
	for _, p := range pods.Items {
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil || !ip.Is4() || p.DeletionTimestamp != nil || !podReady(&p) {
			continue
		}
		out = append(out, endpoints.Endpoint{Name: p.Name, IP: ip})
	}
	return out, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// activatorSlice is the public endpoints in Proxy mode: every port of the
// public Service goes to the activators' port.
func (r *ServerlessService) activatorSlice(public *corev1.Service, acts []endpoints.Endpoint) discoveryv1.EndpointSlice {
	s := discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4}
	for _, p := range public.Spec.Ports {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: ptr(p.Name), Protocol: ptr(p.Protocol), Port: ptr(r.ActivatorPort)})
	}
	for _, a := range acts {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{a.IP.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: r.ActivatorNamespace, Name: a.Name},
		})
	}
	return s
}

// writeSlices makes the public Service's EndpointSlices equal to want
// (each split at Kubernetes' 1000 endpoints per slice), named
// <public>-sockscale-<i>. It returns a message instead when a slice of the
// Service belongs to another manager: two writers would fight.
func (r *ServerlessService) writeSlices(ctx context.Context, sks *v1alpha1.ServerlessService, public *corev1.Service, want []discoveryv1.EndpointSlice) (string, error) {
	var have discoveryv1.EndpointSliceList
	if err := r.Client.List(ctx, &have, client.InNamespace(public.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: public.Name}); err != nil {
		return "", fmt.Errorf("list EndpointSlices of %s: %w", public.Name, err)
	}
	existing := make(map[string]*discoveryv1.EndpointSlice)
	for i := range have.Items {
		s := &have.Items[i]
		if !metav1.IsControlledBy(s, sks) {
			return fmt.Sprintf("EndpointSlice %q of Service %q is managed by %q, not sockscale; delete it so the public endpoints have one writer", s.Name, public.Name, s.Labels[discoveryv1.LabelManagedBy]), nil
		}
		existing[s.Name] = s
	}
	var chunks []discoveryv1.EndpointSlice
	for _, w := range want {
		for start := 0; start < len(w.Endpoints); start += maxSliceEndpoints {
			c := w
			c.Endpoints = w.Endpoints[start:min(start+maxSliceEndpoints, len(w.Endpoints))]
			chunks = append(chunks, c)
		}
	}
	for i, c := range chunks {
		name := fmt.Sprintf("%s-sockscale-%d", public.Name, i)
		s, ok := existing[name]
		delete(existing, name)
		if !ok {
			s = &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: public.Namespace, Name: name, Labels: map[string]string{
				discoveryv1.LabelServiceName: public.Name, discoveryv1.LabelManagedBy: ManagedBy, LabelServerlessService: sks.Name,
			}}}
			if err := controllerutil.SetControllerReference(sks, s, r.Client.Scheme()); err != nil {
				return "", err
			}
		} else if s.AddressType == c.AddressType && equality.Semantic.DeepEqual(s.Endpoints, c.Endpoints) && equality.Semantic.DeepEqual(s.Ports, c.Ports) {
			continue
		}
		s.AddressType, s.Endpoints, s.Ports = c.AddressType, c.Endpoints, c.Ports
		var err error
		if ok {
			err = r.Client.Update(ctx, s)
		} else {
			err = r.Client.Create(ctx, s)
		}
		if err != nil {
			return "", fmt.Errorf("write EndpointSlice %s: %w", name, err)
		}
	}
	for _, s := range existing {
		if err := r.Client.Delete(ctx, s); client.IgnoreNotFound(err) != nil {
			return "", fmt.Errorf("delete EndpointSlice %s: %w", s.Name, err)
		}
	}
	return "", nil
}

func (r *ServerlessService) writeStatus(ctx context.Context, sks *v1alpha1.ServerlessService, status *v1alpha1.ServerlessServiceStatus) error {
	if equality.Semantic.DeepEqual(&sks.Status, status) {
		return nil
	}
	sks.Status = *status
	if err := r.Client.Status().Update(ctx, sks); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("update status of ServerlessService %s: %w", sks.Name, err)
	}
	return nil
}

func setSKSCondition(s *v1alpha1.ServerlessServiceStatus, gen int64, st metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: names.ConditionReady, Status: st, Reason: reason, Message: msg, ObservedGeneration: gen})
}

// SetupWithManager watches ServerlessServices, the Services they name and
// those Services' EndpointSlices, and the activator pods.
func (r *ServerlessService) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.ServerlessService{}).
		// What it owns is found by name: the private Service and the
		// public Service's slices map back through naming.
		Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(r.byServiceLabel)).
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(r.byServiceName)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.allForActivator)).
		Complete(r)
}

// byServiceLabel maps an EndpointSlice to the ServerlessServices whose
// public or private Service it belongs to.
func (r *ServerlessService) byServiceLabel(ctx context.Context, o client.Object) []reconcile.Request {
	return r.naming(ctx, o.GetNamespace(), o.GetLabels()[discoveryv1.LabelServiceName])
}

func (r *ServerlessService) byServiceName(ctx context.Context, o client.Object) []reconcile.Request {
	return r.naming(ctx, o.GetNamespace(), o.GetName())
}

// naming lists the ServerlessServices in ns whose public or private
// Service is service.
func (r *ServerlessService) naming(ctx context.Context, ns, service string) []reconcile.Request {
	if service == "" {
		return nil
	}
	var list v1alpha1.ServerlessServiceList
	if err := r.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil
	}
	var out []reconcile.Request
	for _, s := range list.Items {
		if s.Spec.PublicService == service || names.PrivateServiceName(s.Spec.PublicService) == service {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&s)})
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
	var list v1alpha1.ServerlessServiceList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for _, s := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&s)})
	}
	return out
}

func ptr[T any](v T) *T { return &v }
