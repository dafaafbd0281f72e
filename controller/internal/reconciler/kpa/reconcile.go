package kpa

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/bucket"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
	"github.com/sockscale/sockscale/controller/internal/scaletarget"
)

// TickPeriod is how often each target is decided (docs/autoscaling.md,
// "Timing").
const TickPeriod = 2 * time.Second

// PodAutoscaler reconciles PodAutoscalers.
type PodAutoscaler struct {
	Client client.Client
	// APIReader, if set, reads past the cache (an HPA the cache does not
	// hold); nil: Client.
	APIReader client.Reader
	Collector *collector.Collector
	Clock     clock.PassiveClock
	// Config returns the cluster defaults in force.
	Config func() *config.Config
	// Metrics, if set, get each decision.
	Metrics *Metrics
	// Prober tells whether an activator answers on a public Service; the
	// last pod of a target goes only when one does.
	Prober Prober
	// Events, if set, gets an Event per scaling and panic transition.
	Events events.EventRecorder
	// MaxConcurrentReconciles is how many PodAutoscalers are decided at
	// once (0: controller-runtime's default, 1). controller-runtime never
	// reconciles one key twice at once, so a target's carried state
	// (targetState's decider and zero rules) has one writer; what targets
	// share (targets, atZero and the copy of it Poke reads) is under mu.
	MaxConcurrentReconciles int
	// StatusWriters, if above 0, write statuses apart from the decisions,
	// the latest of each target (statusWriter); 0 writes each in its
	// Reconcile.
	StatusWriters int
	// ScaleTargetKinds are the kinds a PodAutoscaler may scale; nil:
	// scaletarget.DefaultKinds (Deployments and StatefulSets).
	ScaleTargetKinds scaletarget.Kinds
	// Discovery, if set, tells a target that does not exist from one of
	// a kind without /scale (both are a 404); nil: the condition says
	// either.
	Discovery discovery.DiscoveryInterface
	// Buckets, if set, are the targets (by the workload they scale)
	// this replica decides, its other replicas deciding the rest: the
	// reconciler then runs on every replica, leader or not. Nil: every
	// target, on the leader.
	Buckets *bucket.Set

	mu      sync.Mutex
	targets map[collector.Key]*targetState // by PodAutoscaler
	// atZero indexes the targets whose last decision was zero pods by
	// their collected key (the Deployment), for Poke: only those are
	// woken by load. 5,000 agents' batches a second each name up to 100
	// loaded targets; looking each up among all targets took a tenth of
	// the controller's CPU at 3,000 targets.
	atZero map[collector.Key]map[collector.Key]struct{}
	// zeroIndex is a copy of atZero that Poke reads without mu, made
	// anew on each change (targets reach or leave zero a few times a
	// second at most): with mu, the stats handlers queued on it behind
	// the reconcilers and each other, 127 of them at once at 3,000
	// targets, and posts timed out.
	zeroIndex atomic.Pointer[map[collector.Key][]collector.Key]
	// pokes carries PodAutoscalers to decide at once (Poke).
	pokes chan event.GenericEvent
	// pokedAt holds, by PodAutoscaler, when a poke woke it (wall time)
	// until a decision ends, for Metrics' poke duration.
	pokedAt sync.Map
	// decisionLog is shared by every decider (deciderLog).
	decisionLog logr.Logger
	// writer writes statuses when StatusWriters > 0.
	writer *statusWriter
	// schedules holds each PodAutoscaler's minScaleSchedule, read
	// (parsedSchedule), by PodAutoscaler.
	schedules sync.Map
}

var _ reconcile.Reconciler = (*PodAutoscaler)(nil)

// +kubebuilder:rbac:groups=sockscale.dev,resources=podautoscalers,verbs=get;list;watch
// +kubebuilder:rbac:groups=sockscale.dev,resources=podautoscalers/status,verbs=update
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=deployments/scale,verbs=get;update
// +kubebuilder:rbac:groups=apps,resources=statefulsets/scale,verbs=get;update
// +kubebuilder:rbac:groups=sockscale.dev,resources=serverlessservices,verbs=get;list;watch;create;update
// +kubebuilder:rbac:groups=autoscaling,resources=horizontalpodautoscalers,verbs=get;list;watch;create;update;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile decides one target and scales it.
func (r *PodAutoscaler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	key := collector.Key{Namespace: req.Namespace, Name: req.Name}
	var pa v1alpha1.PodAutoscaler
	if err := r.Client.Get(ctx, req.NamespacedName, &pa); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(key)
			r.Metrics.forget(req.Namespace, req.Name)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, err
	}
	leave, owned := r.Buckets.Enter(pa.Namespace, pa.Spec.ScaleTargetRef.Name)
	if !owned {
		// Its bucket is another replica's now (a tick queued before it
		// was lost brings it here once): drop what this replica carried
		// for it, so that a bucket won back starts from a new decider,
		// as after a failover.
		r.forget(key)
		r.Metrics.forget(req.Namespace, req.Name)
		return ctrl.Result{}, nil
	}
	// Until the decision is written, the bucket is not handed over.
	defer leave()
	now := r.Clock.Now()
	started := time.Now() // the decision's latency is wall time, whatever Clock says
	status := pa.Status.DeepCopy()
	status.ObservedGeneration = pa.Generation

	tgt, reason, msg := r.target(ctx, &pa)
	if tgt == nil {
		r.unpoke(key)
		setCondition(status, pa.Generation, names.ConditionReady, metav1.ConditionFalse, reason, msg)
		return ctrl.Result{RequeueAfter: 10 * time.Second, Priority: ptr.To(tickPriority)}, r.writeStatus(ctx, &pa, status)
	}
	settings, err := config.ForTarget(r.Config(), &pa, tgt.template, tgt.gvk.Kind+" "+tgt.name)
	if err != nil {
		r.unpoke(key)
		setCondition(status, pa.Generation, names.ConditionReady, metav1.ConditionFalse, "InvalidSettings", err.Error())
		// Looked at again like a missing target: what fixes the
		// settings is watched by no one here, neither the cluster's
		// ConfigMap (re-read every 10 s: allow-zero-initial-scale set
		// just after the PodAutoscaler was made) nor the Deployment's
		// annotations.
		return ctrl.Result{RequeueAfter: 10 * time.Second, Priority: ptr.To(tickPriority)}, r.writeStatus(ctx, &pa, status)
	}
	window, err := r.raiseMinScale(key, &pa, &settings, now)
	if err != nil {
		r.unpoke(key)
		setCondition(status, pa.Generation, names.ConditionReady, metav1.ConditionFalse, "InvalidSettings", err.Error())
		return ctrl.Result{RequeueAfter: 10 * time.Second, Priority: ptr.To(tickPriority)}, r.writeStatus(ctx, &pa, status)
	}
	status.MinScaleWindow = window
	o, err := r.decide(ctx, key, &pa, tgt, settings, now, status)
	if errors.Is(err, errNotOwned) {
		r.unpoke(key)
		setCondition(status, pa.Generation, names.ConditionReady, metav1.ConditionFalse, names.ReasonNotOwned, err.Error())
		return ctrl.Result{RequeueAfter: 10 * time.Second, Priority: ptr.To(tickPriority)}, r.writeStatus(ctx, &pa, status)
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.apply(ctx, key, &pa, tgt, settings, o); err != nil {
		return ctrl.Result{}, err
	}
	if at, ok := r.pokedAt.LoadAndDelete(key); ok {
		r.Metrics.poked(time.Since(at.(time.Time)))
	}
	r.Metrics.record(pa.Namespace, pa.Name, o.want, o.values.Stable, o.values.Panic, o.dec.ExcessBurstCapacity, o.dec.Panicking, o.values.Missing,
		time.Since(started).Seconds(), r.state(key).sinceDecided(started).Seconds())
	st := r.state(key)
	next := tickStatus(&pa.Status, status, pa.Generation, settings, o, now.Sub(st.messagesAt) >= messageRefresh)
	if !equality.Semantic.DeepEqual(&pa.Status, next) {
		st.messagesAt = now // what is written shows the messages of now
	}
	return ctrl.Result{RequeueAfter: TickPeriod, Priority: ptr.To(tickPriority)}, r.writeStatus(ctx, &pa, next)
}

// unpoke drops the time a poke woke pa when the reconcile it woke cannot
// decide (no target, invalid settings, a ServerlessService it does not
// own): the wait for a fix is no poke's latency, and the next decision
// would otherwise observe all of it. An error that is retried keeps it:
// the retry is part of the poke's time.
func (r *PodAutoscaler) unpoke(pa collector.Key) { r.pokedAt.Delete(pa) }

// SetupWithManager watches PodAutoscalers, their ServerlessServices, and
// pokes. A PodAutoscaler's own status writes do not wake it (only a new
// generation does, a spec change): each write would otherwise bring its
// next decision forward, a second write, and so on (at 100 targets, 75
// decisions a second instead of 50); the tick comes every 2 s anyway.
// With buckets, only the owned PodAutoscalers' events are queued (and
// Reconcile checks again: a ServerlessService's event, a tick), and a
// won bucket queues its PodAutoscalers at once.
func (r *PodAutoscaler) SetupWithManager(mgr ctrl.Manager) error {
	opts := controller.Options{MaxConcurrentReconciles: r.MaxConcurrentReconciles}
	owned := predicate.NewPredicateFuncs(func(o client.Object) bool {
		pa, ok := o.(*v1alpha1.PodAutoscaler)
		return ok && r.owns(pa)
	})
	b := ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.PodAutoscaler{}, builder.WithPredicates(predicate.GenerationChangedPredicate{}, owned)).
		Owns(&v1alpha1.ServerlessService{}).
		// The HPA class's HPAs: an edit or deletion by someone else is
		// corrected at once; the HPA's status (every 15 s) waits for the
		// tick.
		Owns(&autoscalingv2.HorizontalPodAutoscaler{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(source.Channel(r.pokeChannel(), pokeHandler))
	if r.Buckets != nil {
		opts.NeedLeaderElection = ptr.To(false)
		b = b.WatchesRawSource(r.Buckets.Resync(r.ownedKeys, mgr.GetLogger().WithName("podautoscaler")))
	}
	if r.StatusWriters > 0 {
		r.writer = newStatusWriter(r.Client, r.StatusWriters)
		if err := mgr.Add(r.writer); err != nil {
			return err
		}
	}
	return b.WithOptions(opts).Complete(r)
}

// owns tells whether pa's target is in a bucket this replica holds.
func (r *PodAutoscaler) owns(pa *v1alpha1.PodAutoscaler) bool {
	return r.Buckets.Owns(pa.Namespace, pa.Spec.ScaleTargetRef.Name)
}

// ownedKeys names the PodAutoscalers in the cache that this replica owns.
func (r *PodAutoscaler) ownedKeys(ctx context.Context) ([]types.NamespacedName, error) {
	var list v1alpha1.PodAutoscalerList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil, err
	}
	var keys []types.NamespacedName
	for i := range list.Items {
		if r.owns(&list.Items[i]) {
			keys = append(keys, client.ObjectKeyFromObject(&list.Items[i]))
		}
	}
	return keys, nil
}
