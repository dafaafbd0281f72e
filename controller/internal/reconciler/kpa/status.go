package kpa

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
)

// Condition types of a PodAutoscaler besides names.ConditionReady (and
// ConditionReachable).
const (
	ConditionActive      = "Active"
	ConditionInitialized = "ScaleTargetInitialized"
)

// Reasons of the Ready condition when stats are missing (the agents of
// some ready pods' nodes stopped reporting): estimated from the pods
// heard, or held.
const (
	ReasonPartialStats = "PartialStats"
	ReasonStatsMissing = "StatsMissing"
)

// nodes names the nodes of missing pods for a message.
func nodes(ns []string) string {
	for i, n := range ns {
		if n == "" {
			ns[i] = "node unknown"
		}
	}
	if len(ns) == 1 {
		return "node " + ns[0]
	}
	return "nodes " + strings.Join(ns, ", ")
}

// tickStatus is the status a tick writes: its outcome, with the stable
// and panic values of this tick or, while they only drifted, those shown
// before (settle).
// status is the tick's status so far (old's copy, with the generation
// observed).
func tickStatus(old, status *v1alpha1.PodAutoscalerStatus, gen int64, s config.Settings, o outcome, messagesDue bool) *v1alpha1.PodAutoscalerStatus {
	fresh, held := status.DeepCopy(), status.DeepCopy()
	fillStatus(fresh, gen, s, o, strconv.FormatFloat(o.values.Stable, 'f', 3, 64), strconv.FormatFloat(o.values.Panic, 'f', 3, 64))
	fillStatus(held, gen, s, o, old.StableValue, old.PanicValue)
	return settle(old, held, fresh, messagesDue)
}

// fillStatus writes a tick's outcome into the PodAutoscaler's status,
// showing the stable and panic values given (decimal strings): the
// messages are made from the values shown, not the tick's raw ones.
func fillStatus(status *v1alpha1.PodAutoscalerStatus, gen int64, s config.Settings, o outcome, stable, panicValue string) {
	status.DesiredScale = ptr.To(o.want)
	status.ActualScale = ptr.To(o.ready)
	status.StableValue = stable
	status.PanicValue = panicValue
	status.Panicking = o.dec.Panicking
	if o.dec.Valid {
		status.ExcessBurstCapacity = ptr.To(o.dec.ExcessBurstCapacity)
	}
	status.Mode, status.ModeReason, status.Activators = o.sks.Status.Mode, o.sks.Status.ModeReason, o.sks.Status.Activators
	status.Accounting = o.accounting
	active := metav1.ConditionFalse
	if o.zero.active {
		active = metav1.ConditionTrue
	}
	setCondition(status, gen, ConditionActive, active, o.zero.reason, o.zero.message)
	reachable := metav1.ConditionFalse
	if o.reach.ok {
		reachable = metav1.ConditionTrue
	}
	setCondition(status, gen, ConditionReachable, reachable, o.reach.reason, o.reach.message)
	if o.initialized {
		setCondition(status, gen, ConditionInitialized, metav1.ConditionTrue, "Initialized", fmt.Sprintf("the target reached its initial scale of %d", s.InitialScale))
	} else {
		setCondition(status, gen, ConditionInitialized, metav1.ConditionFalse, "Initializing", fmt.Sprintf("%d of the initial %d pods are ready", o.ready, s.InitialScale))
	}
	if o.hpa != nil {
		st, reason, msg := hpaCondition(o.hpa)
		setCondition(status, gen, ConditionHPA, st, reason, msg)
	} else {
		meta.RemoveStatusCondition(&status.Conditions, ConditionHPA)
	}
	v := o.values
	switch {
	case v.Missing > 0 && !v.Extrapolating:
		setCondition(status, gen, names.ConditionReady, metav1.ConditionFalse, ReasonStatsMissing, fmt.Sprintf(
			"no stats for %s or more from %d of the %d ready pods (%s), and too few were heard to estimate them: the decision holds to the last seconds that had enough; check the sockscale agent on those nodes",
			collector.StaleAfter, v.Missing, v.Expected, nodes(v.MissingNodes)))
	case !v.HasData:
		setCondition(status, gen, names.ConditionReady, metav1.ConditionTrue, "NoData", "no stats have arrived for the target yet; keeping its scale")
	case v.Missing > 0:
		setCondition(status, gen, names.ConditionReady, metav1.ConditionTrue, ReasonPartialStats, fmt.Sprintf(
			"no stats for %s or more from %d of the %d ready pods (%s): their load is estimated from the %d heard; check the sockscale agent on those nodes",
			collector.StaleAfter, v.Missing, v.Expected, nodes(v.MissingNodes), v.Expected-v.Missing))
	case o.ready < o.want:
		setCondition(status, gen, names.ConditionReady, metav1.ConditionTrue, "ScalingUp", fmt.Sprintf("%d of %d pods ready", o.ready, o.want))
	case s.Class == config.ClassExternal:
		setCondition(status, gen, names.ConditionReady, metav1.ConditionTrue, "Scaled", fmt.Sprintf("%d pods, counted by the target's own autoscaler; stable %s %s", o.want, windowedMetric(s), stable))
	case o.hpa != nil:
		setCondition(status, gen, names.ConditionReady, metav1.ConditionTrue, "Scaled", fmt.Sprintf("%d pods, counted by HorizontalPodAutoscaler %s on %s; stable %s %s",
			o.want, o.hpa.Name, s.Metric, windowedMetric(s), stable))
	default:
		setCondition(status, gen, names.ConditionReady, metav1.ConditionTrue, "Scaled", fmt.Sprintf("%d pods for a stable %s of %s", o.want, s.Metric, stable))
	}
}

// windowedMetric is what the stable and panic values are of: the metric,
// or concurrency for the HPA class's cpu and memory (config.Settings).
func windowedMetric(s config.Settings) string {
	if s.Metric == config.MetricRPS {
		return config.MetricRPS
	}
	return config.MetricConcurrency
}

// writeStatus writes status if it changed: every target ticks every 2 s,
// and an idle one should not cost the API server a write each time. With
// status writers (StatusWriters), it hands the write to them and returns.
func (r *PodAutoscaler) writeStatus(ctx context.Context, pa *v1alpha1.PodAutoscaler, status *v1alpha1.PodAutoscalerStatus) error {
	if equality.Semantic.DeepEqual(&pa.Status, status) {
		return nil
	}
	pa.Status = *status
	if r.writer != nil {
		r.writer.write(pa)
		return nil
	}
	if err := r.Client.Status().Update(ctx, pa); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("update status of %s: %w", pa.Name, err)
	}
	return nil
}

func setCondition(s *v1alpha1.PodAutoscalerStatus, gen int64, typ string, st metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&s.Conditions, metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg, ObservedGeneration: gen})
}
