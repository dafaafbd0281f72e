package route

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/endpoints"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
	"github.com/sockscale/sockscale/controller/internal/reconciler/route/rollout"
)

// ConditionAllTrafficAssigned says whether every target of spec.traffic
// names a Revision that exists.
const ConditionAllTrafficAssigned = "AllTrafficAssigned"

// Reconciler reconciles Routes.
type Reconciler struct {
	Client client.Client
	// ActivatorNamespace and ActivatorSelector find the activator pods,
	// the endpoints of a Route's addresses; ActivatorRoutePort is where
	// they split a Route's requests by its percents.
	ActivatorNamespace string
	ActivatorSelector  labels.Selector
	ActivatorRoutePort int32
	// ClusterDomain is the cluster's DNS domain, for URLs.
	ClusterDomain string
	// HTTPRoutes says the API server serves the Gateway API's HTTPRoutes;
	// with Gateway set, each address gets one attached to that Gateway,
	// with the host name <address>.<namespace>.<Domain>.
	HTTPRoutes bool
	Gateway    *types.NamespacedName
	Domain     string
	// Config returns the cluster settings in force (rollout-duration);
	// nil: the defaults.
	Config func() *config.Config
	// Clock is the time rollouts step by (nil: the real clock).
	Clock clock.PassiveClock
}

var _ reconcile.Reconciler = (*Reconciler)(nil)

// +kubebuilder:rbac:groups=serving.sockscale.dev,resources=routes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=serving.sockscale.dev,resources=routes/status,verbs=update
// +kubebuilder:rbac:groups=serving.sockscale.dev,resources=routes/finalizers,verbs=update
// +kubebuilder:rbac:groups=serving.sockscale.dev,resources=revisions,verbs=get;list;watch
// +kubebuilder:rbac:groups=serving.sockscale.dev,resources=services,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=httproutes,verbs=get;list;watch;create;update;delete

// Reconcile resolves one Route's split, keeps its addresses, and writes
// the split in effect into status. When the split cannot be resolved the
// last good one stays in effect.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var rt servingv1alpha1.Route
	if err := r.Client.Get(ctx, req.NamespacedName, &rt); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	status := rt.Status.DeepCopy()
	status.ObservedGeneration = rt.Generation
	revisions, services, err := r.lookups(ctx, rt.Namespace)
	if err != nil {
		return ctrl.Result{}, err
	}
	goal, prob := Resolve(rt.Spec.Traffic, revisions, services)
	setCondition(status, rt.Generation, ConditionAllTrafficAssigned, prob, "every target names a Revision")
	duration, durationProb := r.rolloutDuration(&rt)
	var res ctrl.Result
	var step rollout.Result
	if prob == nil {
		now := r.now()
		step = r.step(ctx, &rt, goal, duration, now)
		status.Traffic = r.withURLs(&rt, step.Traffic)
		status.TrafficSummary = Summary(status.Traffic)
		switch {
		case !step.NextStep.IsZero():
			res.RequeueAfter = max(step.NextStep.Sub(now), 10*time.Millisecond)
		case step.InProgress:
			// Waiting for the first 1 % to be in effect (see step).
			res.RequeueAfter = time.Second
		}
	}

	acts, err := endpoints.ReadyActivators(ctx, r.Client, r.ActivatorNamespace, r.ActivatorSelector)
	if err != nil {
		return ctrl.Result{}, err
	}
	addrProb, err := r.ensureAddresses(ctx, &rt, tags(status.Traffic), acts)
	if err != nil {
		return ctrl.Result{}, err
	}
	url := r.url(rt.Name, rt.Namespace)
	status.URL, status.Address = url, &servingv1alpha1.Addressable{Name: rt.Name, URL: url}
	if r.northSouth() && len(status.Traffic) > 0 {
		valid := slices.DeleteFunc(tags(status.Traffic), func(tag string) bool { return tooLong(rt.Name, []string{tag}) != nil })
		hrProb, err := r.ensureHTTPRoutes(ctx, &rt, status.Traffic, valid)
		if err != nil {
			return ctrl.Result{}, err
		}
		addrProb = firstOf(addrProb, hrProb)
		r.externalURLs(&rt, status)
	}
	prob = firstOf(firstOf(prob, addrProb), durationProb)
	if prob == nil && step.InProgress {
		prob = &problem{metav1.ConditionUnknown, ReasonRolloutInProgress, rolloutMessage}
	}
	setCondition(status, rt.Generation, names.ConditionReady, prob, "traffic is split as spec.traffic says")
	written, err := r.writeStatus(ctx, &rt, status)
	switch {
	case err != nil:
		return ctrl.Result{}, err
	case !written:
		// A conflict: look again before keeping a state whose split
		// may not have reached status.
		return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
	}
	if step.State != nil {
		if err := r.keepState(ctx, &rt, step.State); err != nil {
			return ctrl.Result{}, err
		}
	}
	return res, nil
}

// lookups are the namespace's Revisions and Services by name.
func (r *Reconciler) lookups(ctx context.Context, ns string) (map[string]*servingv1alpha1.Revision, map[string]*servingv1alpha1.Service, error) {
	var revs servingv1alpha1.RevisionList
	if err := r.Client.List(ctx, &revs, client.InNamespace(ns)); err != nil {
		return nil, nil, fmt.Errorf("list Revisions: %w", err)
	}
	var svcs servingv1alpha1.ServiceList
	if err := r.Client.List(ctx, &svcs, client.InNamespace(ns)); err != nil {
		return nil, nil, fmt.Errorf("list Services: %w", err)
	}
	revisions := make(map[string]*servingv1alpha1.Revision, len(revs.Items))
	for i := range revs.Items {
		revisions[revs.Items[i].Name] = &revs.Items[i]
	}
	services := make(map[string]*servingv1alpha1.Service, len(svcs.Items))
	for i := range svcs.Items {
		services[svcs.Items[i].Name] = &svcs.Items[i]
	}
	return revisions, services, nil
}

// ensureAddresses keeps the Route's own address and one per tag, and
// removes those of tags gone. A problem is returned for an address that
// cannot be made; the others are made all the same.
func (r *Reconciler) ensureAddresses(ctx context.Context, rt *servingv1alpha1.Route, tags []string, acts []endpoints.Endpoint) (*problem, error) {
	keep := map[string]bool{rt.Name: true}
	first, err := r.ensureAddress(ctx, rt, "", acts)
	if err != nil {
		return nil, err
	}
	for _, tag := range tags {
		if p := tooLong(rt.Name, []string{tag}); p != nil {
			first = firstOf(first, p)
			continue
		}
		keep[AddressName(rt.Name, tag)] = true
		p, err := r.ensureAddress(ctx, rt, tag, acts)
		if err != nil {
			return nil, err
		}
		first = firstOf(first, p)
	}
	return first, r.removeStale(ctx, rt, keep)
}

func firstOf(a, b *problem) *problem {
	if a != nil {
		return a
	}
	return b
}

// url is the cluster-local URL of an address.
func (r *Reconciler) url(service, ns string) string {
	return fmt.Sprintf("http://%s.%s.svc.%s", service, ns, r.ClusterDomain)
}

// withURLs gives each tagged target its address's URL.
func (r *Reconciler) withURLs(rt *servingv1alpha1.Route, traffic []servingv1alpha1.TrafficTargetStatus) []servingv1alpha1.TrafficTargetStatus {
	out := make([]servingv1alpha1.TrafficTargetStatus, len(traffic))
	for i, t := range traffic {
		t.URL = ""
		if t.Tag != "" {
			t.URL = r.url(AddressName(rt.Name, t.Tag), rt.Namespace)
		}
		out[i] = t
	}
	return out
}

// northSouth says whether the Route's addresses get HTTPRoutes.
func (r *Reconciler) northSouth() bool { return r.HTTPRoutes && r.Gateway != nil }

func (r *Reconciler) now() time.Time {
	if r.Clock == nil {
		return time.Now()
	}
	return r.Clock.Now()
}

// setCondition sets typ from p (nil: True with okMessage).
func setCondition(s *servingv1alpha1.RouteStatus, gen int64, typ string, p *problem, okMessage string) {
	c := metav1.Condition{Type: typ, Status: metav1.ConditionTrue, Reason: ReasonReady, Message: okMessage, ObservedGeneration: gen}
	if p != nil {
		c.Status, c.Reason, c.Message = p.status, p.reason, p.message
	}
	meta.SetStatusCondition(&s.Conditions, c)
}

// writeStatus writes status if it changed. It says whether status now
// holds it: false after a conflict (someone wrote the Route meanwhile).
func (r *Reconciler) writeStatus(ctx context.Context, rt *servingv1alpha1.Route, status *servingv1alpha1.RouteStatus) (bool, error) {
	if equality.Semantic.DeepEqual(&rt.Status, status) {
		return true, nil
	}
	rt.Status = *status
	err := r.Client.Status().Update(ctx, rt)
	switch {
	case apierrors.IsConflict(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("update status of Route %s: %w", rt.Name, err)
	}
	return true, nil
}

// SetupWithManager watches Routes, the Services and EndpointSlices they
// own, the Revisions and serving Services they may name (any change in a
// namespace looks at its Routes again: there are few), and the activator
// pods (every address's endpoints).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).
		Named("serving-route").
		For(&servingv1alpha1.Route{}).
		Owns(&corev1.Service{}).
		Owns(&discoveryv1.EndpointSlice{}).
		Watches(&servingv1alpha1.Revision{}, handler.EnqueueRequestsFromMapFunc(r.inNamespace)).
		Watches(&servingv1alpha1.Service{}, handler.EnqueueRequestsFromMapFunc(r.inNamespace)).
		Watches(&corev1.Pod{}, handler.EnqueueRequestsFromMapFunc(r.allForActivator))
	if r.northSouth() {
		b = b.Owns(NewHTTPRoute())
	}
	return b.Complete(r)
}

func (r *Reconciler) inNamespace(ctx context.Context, o client.Object) []reconcile.Request {
	return r.routes(ctx, client.InNamespace(o.GetNamespace()))
}

func (r *Reconciler) allForActivator(ctx context.Context, o client.Object) []reconcile.Request {
	if (r.ActivatorNamespace != "" && o.GetNamespace() != r.ActivatorNamespace) || !r.ActivatorSelector.Matches(labels.Set(o.GetLabels())) {
		return nil
	}
	return r.routes(ctx)
}

func (r *Reconciler) routes(ctx context.Context, opts ...client.ListOption) []reconcile.Request {
	var list servingv1alpha1.RouteList
	if err := r.Client.List(ctx, &list, opts...); err != nil {
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
	}
	return out
}
