package kpa

import (
	"context"
	"fmt"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/decider"
	"github.com/sockscale/sockscale/controller/internal/scaletarget"
)

// apply scales the target through /scale when the count changed, and
// announces scaling and panic transitions as Events.
func (r *PodAutoscaler) apply(ctx context.Context, key collector.Key, pa *v1alpha1.PodAutoscaler, tgt *target, s config.Settings, o outcome) error {
	if o.want != o.current {
		if err := r.scale(ctx, tgt, o.want); err != nil {
			return err
		}
		log.FromContext(ctx).Info("scaled", "target", tgt.name, "kind", tgt.gvk.Kind, "from", o.current, "to", o.want,
			"stable", o.values.Stable, "panic", o.values.Panic, "panicking", o.dec.Panicking, "reason", o.zero.reason)
		r.event(pa, corev1.EventTypeNormal, "Scaled", "Scale", "scaled %s %s from %d to %d pods (stable %s %.3f, panic %.3f; %s)",
			tgt.gvk.Kind, tgt.name, o.current, o.want, s.Metric, o.values.Stable, o.values.Panic, o.zero.reason)
	}
	if o.dec.Valid && o.dec.Panicking != pa.Status.Panicking {
		if o.dec.Panicking {
			r.event(pa, corev1.EventTypeWarning, "Panicking", "Decide", "panic mode: the %s over the panic window (%.3f) wants %d pods, at least %.0f%% of the %d ready",
				s.Metric, o.values.Panic, o.dec.DesiredScale, s.PanicThreshold*100, o.ready)
		} else {
			r.event(pa, corev1.EventTypeNormal, "Unpanicked", "Decide", "left panic mode: no burst for a stable window (%s)", s.StableWindow)
		}
	}
	if o.accounting == v1alpha1.AccountingConnections && o.lastAccounting != v1alpha1.AccountingConnections {
		a := o.values.Accounting
		r.event(pa, corev1.EventTypeWarning, ReasonCountedPerConnection, "Decide",
			"concurrency is connections in flight: over the stable window %.3f of the pods' %.3f requests in flight were on connections "+
				"neither HTTP/1.x nor HTTP/2 with prior knowledge (TLS, upgraded connections, other protocols; on %d pods), each counted as one request "+
				"for its whole life; terminate TLS before the pods or serve h2c (HTTP/2 with prior knowledge) for per-request scaling",
			a.Opaque, a.Concurrency, a.ConnectionPods)
	}
	r.state(key).accounting = o.accounting
	if o.dec.Valid {
		r.setLastDesired(key, o.want)
	}
	return nil
}

// ReasonCountedPerConnection is the reason of the Warning event of a
// target whose status.accounting turns Connections.
const ReasonCountedPerConnection = "CountedPerConnection"

// bounded applies the target's bounds to a decision. Without data the
// current scale stays. min-scale applies only while the target is
// reachable, and without scale to zero at least one pod stays; max-scale
// caps, and until the target first reaches its initial scale it is not
// taken below it (again only while reachable: Knative ignores min-scale
// and initial scale for a Revision no traffic can reach). A 0 here is
// only a wish: the scale-to-zero rules (zeroState) decide when the last
// pod really goes.
func bounded(dec decider.Decision, s config.Settings, current int32, initialized, reachable bool) int32 {
	if !dec.Valid || dec.DesiredScale < 0 {
		return current
	}
	var lowest int32
	if reachable {
		lowest = s.MinScale
	}
	if !s.EnableScaleToZero {
		lowest = max(lowest, 1)
	}
	want := max(dec.DesiredScale, lowest)
	if !initialized && reachable {
		want = max(want, s.InitialScale)
	}
	if s.MaxScale > 0 {
		want = min(want, s.MaxScale)
	}
	return want
}

// scale sets the target's replicas through its /scale subresource: a
// Deployment's read now (the decision was made on the cached Deployment),
// another kind's as this tick read it.
func (r *PodAutoscaler) scale(ctx context.Context, tgt *target, replicas int32) error {
	if tgt.deployment == nil {
		sc := tgt.scale.DeepCopy()
		sc.Spec.Replicas = replicas
		if err := scaletarget.Update(ctx, r.Client, tgt.gvk, sc); err != nil {
			return fmt.Errorf("scale %s to %d: %w", tgt, replicas, err)
		}
		return nil
	}
	d := tgt.deployment
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

// event records an Event on the PodAutoscaler if Events is set.
func (r *PodAutoscaler) event(pa *v1alpha1.PodAutoscaler, typ, reason, action, note string, args ...any) {
	if r.Events != nil {
		r.Events.Eventf(pa, nil, typ, reason, action, note, args...)
	}
}
