package revision

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
)

// Reconciler reconciles Revisions: it makes their Deployment, public
// Service and PodAutoscaler, and reports their readiness.
type Reconciler struct {
	Client client.Client
	// Config returns the cluster settings in force (the pod-spec fields
	// allowed); nil: the defaults.
	Config func() *config.Config
	// Recheck is how soon a Revision using a field not allowed is looked
	// at again, so that turning its key on deploys it (the configuration
	// is re-read, not watched); 0: 30s.
	Recheck time.Duration
	// DrainPort is the node agents' drain port (their --drain-bind-address
	// on the node's loopback): the Revisions' pods wait there before their
	// containers are stopped (drainHook). 0: no such hook.
	DrainPort int32
}

// defaultRecheck: a few periods of the configuration watcher (10 s).
const defaultRecheck = 30 * time.Second

var _ reconcile.Reconciler = (*Reconciler)(nil)

// +kubebuilder:rbac:groups=serving.sockscale.dev,resources=revisions,verbs=get;list;watch
// +kubebuilder:rbac:groups=serving.sockscale.dev,resources=revisions/status,verbs=update
// +kubebuilder:rbac:groups=serving.sockscale.dev,resources=revisions/finalizers,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=sockscale.dev,resources=podautoscalers,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=sockscale.dev,resources=serverlessservices,verbs=get;list;watch
// +kubebuilder:rbac:groups=serving.sockscale.dev,resources=routes,verbs=get;list;watch
// +kubebuilder:rbac:groups=serving.sockscale.dev,resources=services,verbs=get;list;watch

// Reconcile makes one Revision's objects match it and writes its status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var rev servingv1alpha1.Revision
	if err := r.Client.Get(ctx, req.NamespacedName, &rev); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	status := rev.Status.DeepCopy()
	status.ObservedGeneration = rev.Generation
	status.DeploymentName = DeploymentName(rev.Name)
	status.PodAutoscalerName = PodAutoscalerName(rev.Name)
	status.ServiceName = PublicServiceName(rev.Name)
	status.PrivateServiceName = names.PrivateServiceName(status.ServiceName)

	reach, err := r.reachability(ctx, &rev)
	if err != nil {
		return ctrl.Result{}, err
	}
	setRoutingState(status, reach, metav1.Now())
	notAllowed := fieldsNotAllowed(&rev.Spec, r.config().PodSpec)
	var result ctrl.Result
	if notAllowed != "" {
		result.RequeueAfter = r.recheck()
	}
	p, err := r.ensureObjects(ctx, &rev, reach, notAllowed)
	if err != nil {
		return ctrl.Result{}, err
	}
	setPodSpecAllowed(status, rev.Generation, notAllowed)
	if p != nil {
		setReady(status, rev.Generation, metav1.ConditionFalse, p.reason, p.message)
		return result, r.writeStatus(ctx, &rev, status)
	}
	pa, sks, err := r.readAutoscaling(ctx, &rev)
	if err != nil {
		return ctrl.Result{}, err
	}
	if pa != nil {
		status.ActualReplicas, status.DesiredReplicas = pa.Status.ActualScale, pa.Status.DesiredScale
	}
	st, reason, msg := readiness(pa, sks)
	setReady(status, rev.Generation, st, reason, msg)
	return result, r.writeStatus(ctx, &rev, status)
}

func (r *Reconciler) config() *config.Config {
	if r.Config == nil {
		return config.Defaults()
	}
	return r.Config()
}

func (r *Reconciler) recheck() time.Duration {
	if r.Recheck <= 0 {
		return defaultRecheck
	}
	return r.Recheck
}

// problem is why a Revision's objects are not what it wants, for its Ready
// condition (not an error to retry: it needs a person).
type problem struct{ reason, message string }

// ensureObjects creates or corrects the Deployment, the public Service and
// the PodAutoscaler, stopping at the first one that cannot be written.
// notAllowed, when not empty, names the pod-spec fields the configuration
// does not allow: see ensureDeployment.
func (r *Reconciler) ensureObjects(ctx context.Context, rev *servingv1alpha1.Revision, reach v1alpha1.Reachability, notAllowed string) (*problem, error) {
	if p, err := r.ensureDeployment(ctx, rev, notAllowed); p != nil || err != nil {
		return p, err
	}
	if p, err := ensure(ctx, r.Client, rev, "Service", MakePublicService(rev), &corev1.Service{}, serviceInSync, correctService); p != nil || err != nil {
		return p, err
	}
	pa := MakePodAutoscaler(rev)
	pa.Spec.Reachability = reach
	return ensure(ctx, r.Client, rev, "PodAutoscaler", pa, &v1alpha1.PodAutoscaler{}, podAutoscalerInSync, correctPodAutoscaler)
}

// ensureDeployment creates or corrects the Revision's Deployment, unless
// the Revision uses pod-spec fields the configuration does not allow
// (notAllowed). Then no Deployment is made: the controller, which may
// write Deployments in every namespace, must not give a tenant what the
// cluster's settings refuse. One the Revision already controls, made
// before its key was turned off, is left as it is (neither corrected nor
// deleted), so turning a key off stops no running workload; its
// Revision's PodSpecAllowed condition says so.
func (r *Reconciler) ensureDeployment(ctx context.Context, rev *servingv1alpha1.Revision, notAllowed string) (*problem, error) {
	want := MakeDeployment(rev, r.DrainPort)
	if notAllowed == "" {
		return ensure(ctx, r.Client, rev, "Deployment", want, &appsv1.Deployment{}, deploymentInSync, correctDeployment)
	}
	live := &appsv1.Deployment{}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), live)
	switch {
	case err != nil && !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("get Deployment %s: %w", want.Name, err)
	case err == nil && metav1.IsControlledBy(live, rev):
		return nil, nil
	}
	return &problem{ReasonFieldNotAllowed, "pod-spec fields not allowed on this cluster, so no Deployment is made: " + notAllowed}, nil
}

// setPodSpecAllowed sets PodSpecAllowed False while notAllowed names
// fields, and removes it when it names none (most Revisions never have
// it).
func setPodSpecAllowed(s *servingv1alpha1.RevisionStatus, gen int64, notAllowed string) {
	if notAllowed == "" {
		meta.RemoveStatusCondition(&s.Conditions, ConditionPodSpecAllowed)
		return
	}
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: ConditionPodSpecAllowed, Status: metav1.ConditionFalse, Reason: ReasonFieldNotAllowed,
		Message: "pod-spec fields not allowed on this cluster (a Deployment made before they were turned off is left as it is): " + notAllowed, ObservedGeneration: gen})
}

// ensure creates want, controlled by rev, when no object of its name
// exists; corrects the live one when inSync says it drifted; and leaves an
// object rev does not control alone, saying so.
func ensure[T client.Object](ctx context.Context, c client.Client, rev *servingv1alpha1.Revision, kind string, want, live T,
	inSync func(live, want T) bool, correct func(live, want T)) (*problem, error) {
	name := want.GetName()
	err := c.Get(ctx, client.ObjectKeyFromObject(want), live)
	switch {
	case apierrors.IsNotFound(err):
		if err := controllerutil.SetControllerReference(rev, want, c.Scheme()); err != nil {
			return nil, err
		}
		return refused(kind, name, "create", c.Create(ctx, want))
	case err != nil:
		return nil, fmt.Errorf("get %s %s: %w", kind, name, err)
	case !metav1.IsControlledBy(live, rev):
		return &problem{names.ReasonNotOwned, fmt.Sprintf("%s %q exists and is not controlled by Revision %q: rename or delete it so sockscale can make its own", kind, name, rev.Name)}, nil
	case inSync(live, want):
		return nil, nil
	}
	log.FromContext(ctx).Info("correcting a drifted object", "kind", kind, "name", name)
	correct(live, want)
	return refused(kind, name, "update", c.Update(ctx, live))
}

// refused turns the API server's refusal of what the Revision asks for
// (an invalid object) into a problem; other errors are retried.
func refused(kind, name, verb string, err error) (*problem, error) {
	switch {
	case err == nil:
		return nil, nil
	case apierrors.IsInvalid(err):
		return &problem{"Invalid" + kind, fmt.Sprintf("the API server refused to %s %s %q: %v", verb, kind, name, err)}, nil
	default:
		return nil, fmt.Errorf("%s %s %s: %w", verb, kind, name, err)
	}
}

// hasLabels: every label of want is on have with the same value.
func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

func mergeLabels(have, want map[string]string) map[string]string {
	if have == nil {
		have = map[string]string{}
	}
	for k, v := range want {
		have[k] = v
	}
	return have
}

// deploymentInSync compares what the Revision sets: every field it gives
// a value must match (the API server's defaults in fields it leaves empty
// do not count, nor do the replicas, which are the PodAutoscaler's), and
// no container may be added or removed.
func deploymentInSync(live, want *appsv1.Deployment) bool {
	return hasLabels(live.Labels, want.Labels) &&
		len(live.Spec.Template.Spec.Containers) == len(want.Spec.Template.Spec.Containers) &&
		equality.Semantic.DeepDerivative(want.Spec, live.Spec)
}

func correctDeployment(live, want *appsv1.Deployment) {
	live.Labels = mergeLabels(live.Labels, want.Labels)
	live.Spec.Template = want.Spec.Template
	live.Spec.ProgressDeadlineSeconds = want.Spec.ProgressDeadlineSeconds
}

// serviceInSync: the public Service must have no selector (its endpoints
// are its ServerlessService's), be a ClusterIP Service, and have exactly
// the Revision's port.
func serviceInSync(live, want *corev1.Service) bool {
	if !hasLabels(live.Labels, want.Labels) || len(live.Spec.Selector) > 0 || live.Spec.Type != want.Spec.Type || len(live.Spec.Ports) != len(want.Spec.Ports) {
		return false
	}
	for i, w := range want.Spec.Ports {
		h := live.Spec.Ports[i]
		if h.Name != w.Name || h.Port != w.Port || h.Protocol != w.Protocol || h.TargetPort != w.TargetPort || !equality.Semantic.DeepEqual(h.AppProtocol, w.AppProtocol) {
			return false
		}
	}
	return true
}

func correctService(live, want *corev1.Service) {
	live.Labels = mergeLabels(live.Labels, want.Labels)
	live.Spec.Selector = nil
	live.Spec.Type = want.Spec.Type
	live.Spec.Ports = want.Spec.Ports
}

// podAutoscalerInSync: the PodAutoscaler's spec is entirely the
// Revision's (MakePodAutoscaler writes out the one field the API server
// defaults, metric).
func podAutoscalerInSync(live, want *v1alpha1.PodAutoscaler) bool {
	return hasLabels(live.Labels, want.Labels) && equality.Semantic.DeepEqual(live.Spec, want.Spec)
}

func correctPodAutoscaler(live, want *v1alpha1.PodAutoscaler) {
	live.Labels = mergeLabels(live.Labels, want.Labels)
	live.Spec = want.Spec
}

// readAutoscaling returns the Revision's PodAutoscaler and the
// ServerlessService it made (of the same name), each nil when missing.
func (r *Reconciler) readAutoscaling(ctx context.Context, rev *servingv1alpha1.Revision) (*v1alpha1.PodAutoscaler, *v1alpha1.ServerlessService, error) {
	key := types.NamespacedName{Namespace: rev.Namespace, Name: PodAutoscalerName(rev.Name)}
	pa := &v1alpha1.PodAutoscaler{}
	if err := r.Client.Get(ctx, key, pa); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil, nil
		}
		return nil, nil, fmt.Errorf("get PodAutoscaler %s: %w", key.Name, err)
	}
	sks := &v1alpha1.ServerlessService{}
	if err := r.Client.Get(ctx, key, sks); err != nil {
		if apierrors.IsNotFound(err) {
			return pa, nil, nil
		}
		return nil, nil, fmt.Errorf("get ServerlessService %s: %w", key.Name, err)
	}
	return pa, sks, nil
}

// writeStatus writes status if it changed (a conflict is left to the next
// reconcile, which the write that caused it triggers).
func (r *Reconciler) writeStatus(ctx context.Context, rev *servingv1alpha1.Revision, status *servingv1alpha1.RevisionStatus) error {
	if equality.Semantic.DeepEqual(&rev.Status, status) {
		return nil
	}
	rev.Status = *status
	if err := r.Client.Status().Update(ctx, rev); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("update status of Revision %s: %w", rev.Name, err)
	}
	return nil
}

func setReady(s *servingv1alpha1.RevisionStatus, gen int64, st metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: names.ConditionReady, Status: st, Reason: reason, Message: msg, ObservedGeneration: gen})
}

// SetupWithManager watches Revisions, what they own, the
// ServerlessServices their PodAutoscalers make (same name as the
// Revision), and the Routes and Services their routing state comes from.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("serving-revision").
		For(&servingv1alpha1.Revision{}).
		Owns(&appsv1.Deployment{}).
		Owns(&corev1.Service{}).
		Owns(&v1alpha1.PodAutoscaler{}).
		Watches(&v1alpha1.ServerlessService{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(o)}}
		})).
		Watches(&servingv1alpha1.Route{}, handler.EnqueueRequestsFromMapFunc(routedRevisions)).
		Watches(&servingv1alpha1.Service{}, handler.EnqueueRequestsFromMapFunc(r.servicesRevisions)).
		Complete(r)
}
