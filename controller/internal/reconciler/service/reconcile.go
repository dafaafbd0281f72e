package service

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
)

// Conditions of a Service besides names.ConditionReady.
const (
	ConditionConfigurationsReady = "ConfigurationsReady"
	ConditionRoutesReady         = "RoutesReady"
)

// Reasons of a Service's conditions.
const (
	// ReasonRevisionNameTaken: template.metadata.name names a Revision
	// with another spec, or one this Service does not control.
	ReasonRevisionNameTaken = "RevisionNameTaken"
	// ReasonRevisionInvalid: the API server refused the template's
	// Revision.
	ReasonRevisionInvalid = "RevisionInvalid"
	// ReasonRevisionCreating: the latest Revision has not reported yet.
	ReasonRevisionCreating = "RevisionCreating"
	// ReasonRouteCreating: the Route has not reported yet.
	ReasonRouteCreating = "RouteCreating"
	// ReasonTrafficNotMigrated: the Route's split does not name the new
	// latest ready Revision yet (Knative's reason).
	ReasonTrafficNotMigrated = "TrafficNotMigrated"
	// ReasonRouteNotOwned: a Route of the Service's name exists and
	// belongs to someone else.
	ReasonRouteNotOwned = "RouteNotOwned"
)

// Reconciler reconciles Services: it makes the Revision of the current
// template and the Route of the Service's name, which splits its traffic,
// and reports both in status. It never changes an existing Revision.
type Reconciler struct {
	Client client.Client
	// Config returns the cluster settings in force (garbage collection);
	// nil: the defaults.
	Config func() *config.Config
	// Clock decides which old Revisions are old enough to collect (nil:
	// the real clock).
	Clock clock.PassiveClock
}

var _ reconcile.Reconciler = (*Reconciler)(nil)

// +kubebuilder:rbac:groups=serving.sockscale.dev,resources=services,verbs=get;list;watch
// +kubebuilder:rbac:groups=serving.sockscale.dev,resources=services/status,verbs=update
// +kubebuilder:rbac:groups=serving.sockscale.dev,resources=services/finalizers,verbs=update
// +kubebuilder:rbac:groups=serving.sockscale.dev,resources=revisions,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=serving.sockscale.dev,resources=routes,verbs=get;list;watch;create;update

// Reconcile ensures one Service's latest Revision and writes its status.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var svc servingv1alpha1.Service
	if err := r.Client.Get(ctx, req.NamespacedName, &svc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	status := svc.Status.DeepCopy()
	status.ObservedGeneration = svc.Generation
	var all servingv1alpha1.RevisionList
	if err := r.Client.List(ctx, &all, client.InNamespace(svc.Namespace)); err != nil {
		return ctrl.Result{}, fmt.Errorf("list Revisions: %w", err)
	}
	var owned []servingv1alpha1.Revision
	for _, rev := range all.Items {
		if metav1.IsControlledBy(&rev, &svc) {
			owned = append(owned, rev)
		}
	}

	latest, refusal, err := r.ensureRevision(ctx, &svc, all.Items, owned)
	if err != nil {
		return ctrl.Result{}, err
	}
	if latest == nil && refusal == nil {
		// Created just now, or the name was taken between the list and
		// the create: the next look finds it.
		return ctrl.Result{RequeueAfter: time.Second}, r.writeStatus(ctx, &svc, status)
	}
	status.LatestReadyRevisionName = newestReady(owned)
	if refusal != nil {
		setCondition(status, svc.Generation, ConditionConfigurationsReady, metav1.ConditionFalse, refusal.reason, refusal.message)
	} else {
		status.LatestCreatedRevisionName = latest.Name
		st, reason, msg := latestReadiness(latest)
		setCondition(status, svc.Generation, ConditionConfigurationsReady, st, reason, msg)
	}
	rt, err := r.ensureRoute(ctx, &svc)
	if err != nil {
		return ctrl.Result{}, err
	}
	routeStatus(status, &svc, rt)
	setReady(status, svc.Generation)
	if err := r.writeStatus(ctx, &svc, status); err != nil {
		return ctrl.Result{}, err
	}
	return r.collect(ctx, &svc, owned)
}

// collect deletes the Service's Revisions that garbage collection says
// may go (Collect), with what they own, and says when to look again.
func (r *Reconciler) collect(ctx context.Context, svc *servingv1alpha1.Service, owned []servingv1alpha1.Revision) (ctrl.Result, error) {
	cfg := config.Defaults()
	if r.Config != nil {
		cfg = r.Config()
	}
	now := time.Now()
	if r.Clock != nil {
		now = r.Clock.Now()
	}
	doomed, next := Collect(svc, owned, cfg.GC, now)
	for _, name := range doomed {
		rev := &servingv1alpha1.Revision{ObjectMeta: metav1.ObjectMeta{Namespace: svc.Namespace, Name: name}}
		if err := r.Client.Delete(ctx, rev, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return ctrl.Result{}, fmt.Errorf("garbage-collect Revision %s: %w", name, err)
		}
		log.FromContext(ctx).Info("garbage-collected an old Revision no Route sends traffic to", "revision", name)
	}
	if next.IsZero() {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{RequeueAfter: next.Sub(now)}, nil
}

// refusal is why the template makes no Revision: it needs a person.
type refusal struct{ reason, message string }

// ensureRevision returns the Revision of svc's current template, creating
// it when there is none (then it returns nil: the cache shows it soon). It
// returns a refusal instead when the template names a Revision that is not
// this template's.
func (r *Reconciler) ensureRevision(ctx context.Context, svc *servingv1alpha1.Service, all, owned []servingv1alpha1.Revision) (*servingv1alpha1.Revision, *refusal, error) {
	hash, err := TemplateHash(&svc.Spec.Template)
	if err != nil {
		return nil, nil, err
	}
	name := svc.Spec.Template.Metadata.Name
	if name != "" {
		for i := range all {
			rev := &all[i]
			if rev.Name != name {
				continue
			}
			if !metav1.IsControlledBy(rev, svc) {
				return nil, &refusal{ReasonRevisionNameTaken, fmt.Sprintf("the template names Revision %q, which exists and does not belong to this Service: choose another spec.template.metadata.name", name)}, nil
			}
			if !equality.Semantic.DeepEqual(rev.Spec, svc.Spec.Template.Spec) {
				return nil, &refusal{ReasonRevisionNameTaken, fmt.Sprintf("the template names Revision %q, which exists with a different spec (Revisions are immutable): give the changed template a new spec.template.metadata.name", name)}, nil
			}
			return rev, nil, nil
		}
	} else {
		for i := range owned {
			if owned[i].Annotations[TemplateHashAnnotation] == hash {
				return &owned[i], nil, nil
			}
		}
		existing := make([]string, 0, len(all))
		for _, rev := range all {
			existing = append(existing, rev.Name)
		}
		name = NextName(svc.Name, existing)
	}
	rev := MakeRevision(svc, name, hash)
	if err := controllerutil.SetControllerReference(svc, rev, r.Client.Scheme()); err != nil {
		return nil, nil, err
	}
	if err := r.Client.Create(ctx, rev); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil, nil, nil
		}
		if apierrors.IsInvalid(err) {
			return nil, &refusal{ReasonRevisionInvalid, fmt.Sprintf("the API server refused Revision %q: %v", name, err)}, nil
		}
		return nil, nil, fmt.Errorf("create Revision %s: %w", name, err)
	}
	log.FromContext(ctx).Info("created a Revision", "revision", name, "templateHash", hash)
	return nil, nil, nil
}

// latestReadiness is ConfigurationsReady from the latest Revision's Ready.
func latestReadiness(rev *servingv1alpha1.Revision) (metav1.ConditionStatus, string, string) {
	c := meta.FindStatusCondition(rev.Status.Conditions, names.ConditionReady)
	if c == nil {
		return metav1.ConditionUnknown, ReasonRevisionCreating, fmt.Sprintf("Revision %q has not reported yet", rev.Name)
	}
	if c.Status == metav1.ConditionTrue {
		return c.Status, c.Reason, fmt.Sprintf("Revision %q is ready", rev.Name)
	}
	return c.Status, c.Reason, fmt.Sprintf("Revision %q: %s", rev.Name, c.Message)
}

func setCondition(s *servingv1alpha1.ServiceStatus, gen int64, typ string, st metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg, ObservedGeneration: gen})
}

// writeStatus writes status if it changed (a conflict is left to the next
// reconcile).
func (r *Reconciler) writeStatus(ctx context.Context, svc *servingv1alpha1.Service, status *servingv1alpha1.ServiceStatus) error {
	if equality.Semantic.DeepEqual(&svc.Status, status) {
		return nil
	}
	svc.Status = *status
	if err := r.Client.Status().Update(ctx, svc); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("update status of Service %s: %w", svc.Name, err)
	}
	return nil
}

// SetupWithManager watches Services and the Revisions and Routes they own.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("serving-service").
		For(&servingv1alpha1.Service{}).
		Owns(&servingv1alpha1.Revision{}).
		Owns(&servingv1alpha1.Route{}).
		Complete(r)
}
