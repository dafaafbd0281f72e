package kpa

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/sockscale/sockscale/controller/api/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/decider"
	"github.com/sockscale/sockscale/controller/internal/endpoints"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
)

// TickPeriod is how often each target is decided (KPA.md: every 2 s).
const TickPeriod = 2 * time.Second

// Condition types of a PodAutoscaler besides names.names.ConditionReady.
const (
	ConditionActive      = "Active"
	ConditionInitialized = "ScaleTargetInitialized"
)

// PodAutoscaler reconciles PodAutoscalers.
type PodAutoscaler struct {
	Client    client.Client
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

	mu      sync.Mutex
	targets map[collector.Key]*targetState // by PodAutoscaler
	// pokes carries PodAutoscalers to decide at once (Poke).
	pokes chan event.GenericEvent
}

// errSKSNotOwned: a ServerlessService of the PodAutoscaler's name belongs
// to someone else.
var errSKSNotOwned = errors.New("refusing to take it over")

// Prober tells whether requests to a public Service reach an activator.
type Prober interface {
	ActivatorInPath(ctx context.Context, namespace, service string) (bool, error)
}

// targetState is what a PodAutoscaler's ticks carry over.
type targetState struct {
	decider *decider.Decider
	// collected is the collector's key: the Deployment's name.
	collected collector.Key
	// lastDesired is the last decided count (a poke wakes targets at 0).
	lastDesired int32
	zero        zeroState
}

var _ reconcile.Reconciler = (*PodAutoscaler)(nil)

// +kubebuilder:rbac:groups=sockscale.dev,resources=podautoscalers,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=sockscale.dev,resources=podautoscalers/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=apps,resources=deployments,verbs=get;list;watch
// +kubebuilder:rbac:groups=apps,resources=deployments/scale,verbs=get;update;patch
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
	now := r.Clock.Now()
	started := time.Now() // the decision's latency is wall time, whatever Clock says
	status := pa.Status.DeepCopy()
	status.ObservedGeneration = pa.Generation

	deploy, reason, msg := r.target(ctx, &pa)
	if deploy == nil {
		setCondition(status, pa.Generation, names.ConditionReady, metav1.ConditionFalse, reason, msg)
		return ctrl.Result{RequeueAfter: 10 * time.Second}, r.writeStatus(ctx, &pa, status)
	}
	settings, err := r.settings(&pa, deploy)
	if err != nil {
		setCondition(status, pa.Generation, names.ConditionReady, metav1.ConditionFalse, "InvalidSettings", err.Error())
		return ctrl.Result{}, r.writeStatus(ctx, &pa, status)
	}
	o, err := r.decide(ctx, key, &pa, deploy, settings, now, status)
	if errors.Is(err, errSKSNotOwned) {
		setCondition(status, pa.Generation, names.ConditionReady, metav1.ConditionFalse, names.ReasonNotOwned, err.Error())
		return ctrl.Result{RequeueAfter: 10 * time.Second}, r.writeStatus(ctx, &pa, status)
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.apply(ctx, key, &pa, deploy, settings, o); err != nil {
		return ctrl.Result{}, err
	}
	r.Metrics.record(pa.Namespace, pa.Name, o.want, o.values.Stable, o.values.Panic, o.dec.ExcessBurstCapacity, o.dec.Panicking, time.Since(started).Seconds())
	fillStatus(status, pa.Generation, settings, o)
	return ctrl.Result{RequeueAfter: TickPeriod}, r.writeStatus(ctx, &pa, status)
}

// outcome is one tick: the decision, the count it leads to, and what the
// target's ServerlessService reports.
type outcome struct {
	dec         decider.Decision
	values      collector.Values
	current     int32 // the Deployment's replicas before this tick
	want        int32 // after bounds and the scale-to-zero rules
	ready       int32
	initialized bool
	zero        zeroOutcome
	sks         *v1alpha1.ServerlessService
}

// decide runs the target's decider on the collector's windows, bounds the
// result, writes the wanted mode to the ServerlessService and applies the
// scale-to-zero rules.
func (r *PodAutoscaler) decide(ctx context.Context, key collector.Key, pa *v1alpha1.PodAutoscaler, deploy *appsv1.Deployment, settings config.Settings, now time.Time, status *v1alpha1.PodAutoscalerStatus) (outcome, error) {
	// The collector keys targets by their Deployment, as agents report pods.
	tkey := collector.Key{Namespace: pa.Namespace, Name: deploy.Name}
	if err := r.Collector.Watch(tkey, settings); err != nil {
		return outcome{}, err
	}
	o := outcome{ready: deploy.Status.ReadyReplicas, current: 1}
	if deploy.Spec.Replicas != nil {
		o.current = *deploy.Spec.Replicas
	}
	d := r.decider(key, tkey, settings, o.ready, now)
	var err error
	if o.values, err = r.Collector.Values(tkey, now); err != nil {
		return outcome{}, err
	}
	o.dec = d.Decide(now, decider.Inputs{ReadyPods: o.ready, Stable: o.values.Stable, Panic: o.values.Panic, HasData: o.values.HasData, Reachable: true})
	o.initialized = meta.IsStatusConditionTrue(status.Conditions, ConditionInitialized) || o.ready >= settings.InitialScale
	want := bounded(o.dec, settings, o.current, o.initialized)
	// The mode follows the decision (KPA.md: Serve iff pods are wanted and
	// their burst capacity is covered); the zero rules below may still hold
	// the last pod while the activator takes over.
	mode, _ := endpoints.Wanted(want, o.dec.ExcessBurstCapacity)
	if o.sks, err = r.ensureSKS(ctx, pa, deploy, mode, o.dec.Activators); err != nil {
		return outcome{}, err
	}
	o.zero = r.state(key).zero.apply(zeroInputs{
		now: now, want: want, current: o.current, ready: o.ready, mode: o.sks.Status.Mode, s: settings,
		progressDeadline: progressDeadline(deploy),
		activatorInPath:  func() bool { return r.activatorInPath(ctx, pa.Namespace, pa.Spec.Service.Name) },
	})
	o.want = o.zero.pods
	return o, nil
}

// apply scales the target through /scale when the count changed, and
// announces scaling and panic transitions as Events.
func (r *PodAutoscaler) apply(ctx context.Context, key collector.Key, pa *v1alpha1.PodAutoscaler, deploy *appsv1.Deployment, s config.Settings, o outcome) error {
	if o.want != o.current {
		if err := r.scale(ctx, deploy, o.want); err != nil {
			return err
		}
		log.FromContext(ctx).Info("scaled", "target", deploy.Name, "from", o.current, "to", o.want,
			"stable", o.values.Stable, "panic", o.values.Panic, "panicking", o.dec.Panicking, "reason", o.zero.reason)
		r.event(pa, corev1.EventTypeNormal, "Scaled", "Scale", "scaled Deployment %s from %d to %d pods (stable %s %.3f, panic %.3f; %s)",
			deploy.Name, o.current, o.want, s.Metric, o.values.Stable, o.values.Panic, o.zero.reason)
	}
	if o.dec.Valid && o.dec.Panicking != pa.Status.Panicking {
		if o.dec.Panicking {
			r.event(pa, corev1.EventTypeWarning, "Panicking", "Decide", "panic mode: the %s over the panic window (%.3f) wants %d pods, at least %.0f%% of the %d ready",
				s.Metric, o.values.Panic, o.dec.DesiredScale, s.PanicThreshold*100, o.ready)
		} else {
			r.event(pa, corev1.EventTypeNormal, "Unpanicked", "Decide", "left panic mode: no burst for a stable window (%s)", s.StableWindow)
		}
	}
	if o.dec.Valid {
		r.state(key).lastDesired = o.want
	}
	return nil
}

// fillStatus writes a tick's outcome into the PodAutoscaler's status.
func fillStatus(status *v1alpha1.PodAutoscalerStatus, gen int64, s config.Settings, o outcome) {
	status.DesiredScale = ptr(o.want)
	status.ActualScale = ptr(o.ready)
	status.StableValue = strconv.FormatFloat(o.values.Stable, 'f', 3, 64)
	status.PanicValue = strconv.FormatFloat(o.values.Panic, 'f', 3, 64)
	status.Panicking = o.dec.Panicking
	if o.dec.Valid {
		status.ExcessBurstCapacity = ptr(o.dec.ExcessBurstCapacity)
	}
	status.Mode, status.Activators = o.sks.Status.Mode, o.sks.Status.Activators
	active := metav1.ConditionFalse
	if o.zero.active {
		active = metav1.ConditionTrue
	}
	setCondition(status, gen, ConditionActive, active, o.zero.reason, o.zero.message)
	if o.initialized {
		setCondition(status, gen, ConditionInitialized, metav1.ConditionTrue, "Initialized", fmt.Sprintf("the target reached its initial scale of %d", s.InitialScale))
	} else {
		setCondition(status, gen, ConditionInitialized, metav1.ConditionFalse, "Initializing", fmt.Sprintf("%d of the initial %d pods are ready", o.ready, s.InitialScale))
	}
	switch {
	case !o.values.HasData:
		setCondition(status, gen, names.ConditionReady, metav1.ConditionTrue, "NoData", "no stats have arrived for the target yet; keeping its scale")
	case o.ready < o.want:
		setCondition(status, gen, names.ConditionReady, metav1.ConditionTrue, "ScalingUp", fmt.Sprintf("%d of %d pods ready", o.ready, o.want))
	default:
		setCondition(status, gen, names.ConditionReady, metav1.ConditionTrue, "Scaled", fmt.Sprintf("%d pods for a stable %s of %.3f", o.want, s.Metric, o.values.Stable))
	}
}

// target returns the Deployment to scale, or why there is none.
func (r *PodAutoscaler) target(ctx context.Context, pa *v1alpha1.PodAutoscaler) (*appsv1.Deployment, string, string) {
	ref := pa.Spec.ScaleTargetRef
	if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" {
		return nil, "UnsupportedScaleTarget", fmt.Sprintf("scaleTargetRef %s %s: only apps/v1 Deployments are supported so far", ref.APIVersion, ref.Kind)
	}
	var d appsv1.Deployment
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: pa.Namespace, Name: ref.Name}, &d); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, "ScaleTargetNotFound", fmt.Sprintf("Deployment %q does not exist in namespace %q", ref.Name, pa.Namespace)
		}
		return nil, "ScaleTargetUnreadable", err.Error()
	}
	if d.Spec.Selector == nil || len(d.Spec.Selector.MatchLabels) == 0 || len(d.Spec.Selector.MatchExpressions) > 0 {
		return nil, "UnsupportedSelector", fmt.Sprintf("Deployment %q: its selector must be matchLabels only, because the private Service selects the same pods", ref.Name)
	}
	return &d, "", ""
}

// settings merges the cluster config, the pod template's annotations and
// the spec.
func (r *PodAutoscaler) settings(pa *v1alpha1.PodAutoscaler, d *appsv1.Deployment) (config.Settings, error) {
	ann, err := config.ParseAnnotations(d.Spec.Template.Annotations)
	if err != nil {
		return config.Settings{}, fmt.Errorf("pod template of Deployment %s: %w", d.Name, err)
	}
	return config.Effective(r.Config(), pa.Spec.ContainerConcurrency, ann, specOverrides(&pa.Spec))
}

func specOverrides(s *v1alpha1.PodAutoscalerSpec) *config.Overrides {
	o := &config.Overrides{
		MinScale: s.MinScale, MaxScale: s.MaxScale, InitialScale: s.InitialScale, ActivationScale: s.ActivationScale,
		Target: s.Target, TargetUtilizationPercentage: s.TargetUtilizationPercentage, TargetBurstCapacity: s.TargetBurstCapacity,
		PanicWindowPercentage: s.PanicWindowPercentage, PanicThresholdPercentage: s.PanicThresholdPercentage,
	}
	if s.Metric != "" {
		o.Metric = &s.Metric
	}
	if s.MetricAggregationAlgorithm != "" {
		o.Aggregation = &s.MetricAggregationAlgorithm
	}
	if s.ScaleDownDelay != nil {
		o.ScaleDownDelay = &s.ScaleDownDelay.Duration
	}
	if s.Window != nil {
		o.Window = &s.Window.Duration
	}
	if s.ScaleToZeroPodRetentionPeriod != nil {
		o.ScaleToZeroPodRetentionPeriod = &s.ScaleToZeroPodRetentionPeriod.Duration
	}
	return o
}

// bounded applies the target's bounds to a decision. Without data the
// current scale stays. min-scale applies (the target is reachable), and
// without scale to zero at least one pod stays; max-scale caps, and until
// the target first reaches its initial scale it is not taken below it. A
// 0 here is only a wish: the scale-to-zero rules (zeroState) decide when
// the last pod really goes.
func bounded(dec decider.Decision, s config.Settings, current int32, initialized bool) int32 {
	if !dec.Valid || dec.DesiredScale < 0 {
		return current
	}
	lowest := s.MinScale
	if !s.EnableScaleToZero {
		lowest = max(lowest, 1)
	}
	want := max(dec.DesiredScale, lowest)
	if !initialized {
		want = max(want, s.InitialScale)
	}
	if s.MaxScale > 0 {
		want = min(want, s.MaxScale)
	}
	return want
}

// progressDeadline is how long the Deployment may take to make progress
// (Kubernetes' default 600 s).
func progressDeadline(d *appsv1.Deployment) time.Duration {
	if d.Spec.ProgressDeadlineSeconds != nil {
		return time.Duration(*d.Spec.ProgressDeadlineSeconds) * time.Second
	}
	return 600 * time.Second
}

// activatorInPath asks the Prober; an error is logged and counts as no.
func (r *PodAutoscaler) activatorInPath(ctx context.Context, ns, service string) bool {
	if r.Prober == nil {
		return false
	}
	ok, err := r.Prober.ActivatorInPath(ctx, ns, service)
	if err != nil {
		log.FromContext(ctx).V(1).Info("activator probe failed; keeping the last pod", "service", service, "error", err.Error())
	}
	return ok && err == nil
}

// ensureSKS writes the target's ServerlessService (same name, owned by the
// PodAutoscaler) with the wanted mode, and returns it with its status.
func (r *PodAutoscaler) ensureSKS(ctx context.Context, pa *v1alpha1.PodAutoscaler, d *appsv1.Deployment, mode v1alpha1.Mode, activators int32) (*v1alpha1.ServerlessService, error) {
	spec := v1alpha1.ServerlessServiceSpec{Mode: mode, NumActivators: activators, PublicService: pa.Spec.Service.Name, Selector: d.Spec.Selector.MatchLabels}
	sks := &v1alpha1.ServerlessService{ObjectMeta: metav1.ObjectMeta{Namespace: pa.Namespace, Name: pa.Name}}
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(sks), sks)
	switch {
	case apierrors.IsNotFound(err):
		sks.Spec = spec
		if err := controllerutil.SetControllerReference(pa, sks, r.Client.Scheme()); err != nil {
			return nil, err
		}
		if err := r.Client.Create(ctx, sks); err != nil {
			return nil, fmt.Errorf("create ServerlessService %s: %w", sks.Name, err)
		}
		return sks, nil
	case err != nil:
		return nil, err
	case !metav1.IsControlledBy(sks, pa):
		return nil, fmt.Errorf("ServerlessService %q exists and is not controlled by PodAutoscaler %q (delete it so sockscale can make its own): %w", sks.Name, pa.Name, errSKSNotOwned)
	case equality.Semantic.DeepEqual(sks.Spec, spec):
		return sks, nil
	}
	sks.Spec = spec
	if err := r.Client.Update(ctx, sks); err != nil {
		return nil, fmt.Errorf("update ServerlessService %s: %w", sks.Name, err)
	}
	return sks, nil
}

// decider returns the PodAutoscaler's decider, made on its first tick (a
// busy target starts in panic, see decider.New).
func (r *PodAutoscaler) decider(key, collected collector.Key, s config.Settings, ready int32, now time.Time) *decider.Decider {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.targets == nil {
		r.targets = make(map[collector.Key]*targetState)
	}
	t, ok := r.targets[key]
	if !ok {
		t = &targetState{decider: decider.New(s, ready, now, log.Log.WithName("decider").WithValues("podautoscaler", key.String())), lastDesired: -1}
		r.targets[key] = t
	}
	if t.collected != collected && t.collected != (collector.Key{}) {
		r.Collector.Forget(t.collected) // the PodAutoscaler now points elsewhere
	}
	t.collected = collected
	t.decider.Update(s)
	return t.decider
}

// state is the PodAutoscaler's carried state (made by decider).
func (r *PodAutoscaler) state(key collector.Key) *targetState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.targets[key]
}

// Poke decides at once the targets (collector keys, by Deployment) that
// got load while their last desired scale was 0 (KPA.md "Timing"): a
// request waiting in the activator should not wait for the next tick.
func (r *PodAutoscaler) Poke(loaded []collector.Key) {
	if len(loaded) == 0 {
		return
	}
	r.mu.Lock()
	var wake []collector.Key
	for _, k := range loaded {
		for pa, t := range r.targets {
			if t.collected == k && t.lastDesired == 0 {
				wake = append(wake, pa)
			}
		}
	}
	r.mu.Unlock()
	for _, pa := range wake {
		select {
		case r.pokeChannel() <- event.GenericEvent{Object: &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: pa.Namespace, Name: pa.Name}}}:
		default: // a poke is already queued; the tick comes anyway
		}
	}
}

func (r *PodAutoscaler) pokeChannel() chan event.GenericEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pokes == nil {
		r.pokes = make(chan event.GenericEvent, 1024)
	}
	return r.pokes
}

// SetupWithManager watches PodAutoscalers, their ServerlessServices, and
// pokes.
func (r *PodAutoscaler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&v1alpha1.PodAutoscaler{}).
		Owns(&v1alpha1.ServerlessService{}).
		WatchesRawSource(source.Channel(r.pokeChannel(), &handler.EnqueueRequestForObject{})).
		Complete(r)
}

// forget drops a deleted PodAutoscaler's state.
func (r *PodAutoscaler) forget(key collector.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.targets[key]; ok {
		r.Collector.Forget(t.collected)
		delete(r.targets, key)
	}
}

// scale sets the Deployment's replicas through its /scale subresource.
func (r *PodAutoscaler) scale(ctx context.Context, d *appsv1.Deployment, replicas int32) error {
	sc := &autoscalingv1.Scale{}
	if err := r.Client.SubResource("scale").Get(ctx, d, sc); err != nil {
		return fmt.Errorf("get scale of %s: %w", d.Name, err)
	}
	sc.Spec.Replicas = replicas
	if err := r.Client.SubResource("scale").Update(ctx, d, client.WithSubResourceBody(sc)); err != nil {
		return fmt.Errorf("scale %s to %d: %w", d.Name, replicas, err)
	}
	return nil
}

// writeStatus writes status if it changed: every target ticks every 2 s,
// and an idle one should not cost the API server a write each time.
func (r *PodAutoscaler) writeStatus(ctx context.Context, pa *v1alpha1.PodAutoscaler, status *v1alpha1.PodAutoscalerStatus) error {
	if equality.Semantic.DeepEqual(&pa.Status, status) {
		return nil
	}
	pa.Status = *status
	if err := r.Client.Status().Update(ctx, pa); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("update status of %s: %w", pa.Name, err)
	}
	return nil
}

func (r *PodAutoscaler) event(pa *v1alpha1.PodAutoscaler, typ, reason, action, note string, args ...any) {
	if r.Events != nil {
		r.Events.Eventf(pa, nil, typ, reason, action, note, args...)
	}
}

func setCondition(s *v1alpha1.PodAutoscalerStatus, gen int64, typ string, st metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg, ObservedGeneration: gen})
}

func ptr[T any](v T) *T { return &v }
