package kpa

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/config"
)

// activationGrace is added to the target's progress deadline before a
// scale from zero that never got a ready pod is given up
// (docs/autoscaling.md, "Activation timeout").
const activationGrace = 30 * time.Second

// Reasons of the Active condition.
const (
	ReasonActive              = "Active"
	ReasonActivating          = "Activating"
	ReasonNoTraffic           = "NoTraffic"
	ReasonActivationTimeout   = "ActivationTimeout"
	ReasonWaitingToScaleDown  = "WaitingToScaleDown"
	ReasonWaitingForActivator = "WaitingForActivator"
)

// zeroState is what the scale-to-zero rules (docs/autoscaling.md, "Scale
// to zero") remember across ticks.
// Zero times mean "not now".
type zeroState struct {
	activeSince     time.Time // first tick of this stretch with a ready pod
	inactiveSince   time.Time // first tick of this stretch that wanted no pod
	proxySince      time.Time // first tick of this stretch in Proxy mode
	activatingSince time.Time // pods wanted, none ready, since
}

// zeroInputs are one tick's facts.
type zeroInputs struct {
	now time.Time
	// want is the bounded decision: 0 only where scale to zero is allowed.
	want           int32
	current, ready int32
	// mode is the ServerlessService's mode in force.
	mode             v1alpha1.Mode
	s                config.Settings
	progressDeadline time.Duration
	// reachable: traffic can reach the target (reach.ok); noPath: there
	// is not even a public Service (reach.noPath).
	reachable, noPath bool
	// activatorInPath probes the public Service (called only when the
	// last pod is about to go, so a probe is rare).
	activatorInPath func() bool
}

// zeroOutcome is the pod count to set and the Active condition. Messages
// name instants, not durations, so an unchanged state writes no status.
type zeroOutcome struct {
	pods            int32
	active          bool
	reason, message string
}

// apply runs the rules. The last pod goes only when all hold: the target
// was active for a whole stable window (a cold start is not judged idle
// at once), it has wanted no pod for the pod retention period and for the
// grace period (or was already in Proxy mode for the grace period), and
// an activator is in its path (Proxy mode, and a probe of the public
// Service answered by an activator unless TBC = -1 keeps it there anyway).
// A scale from zero whose pods never become ready is given up after the
// progress deadline plus 30 s.
//
// Example, defaults (stable window 60 s, grace 30 s, retention 0): a pod
// ready since t=0 that stops getting requests at t=100 is in Proxy mode from
// t=100 (desired 0) and goes at t=130 if the probe finds the activator.
func (z *zeroState) apply(in zeroInputs) zeroOutcome {
	since := func(t *time.Time, cond bool) {
		switch {
		case !cond:
			*t = time.Time{}
		case t.IsZero():
			*t = in.now
		}
	}
	since(&z.activeSince, in.ready > 0)
	since(&z.proxySince, in.mode == v1alpha1.ModeProxy)
	since(&z.activatingSince, in.want > 0 && in.ready == 0)
	since(&z.inactiveSince, in.want == 0)

	if in.want > 0 {
		if !z.activatingSince.IsZero() {
			if limit := in.progressDeadline + activationGrace; in.now.Sub(z.activatingSince) > limit {
				return zeroOutcome{0, false, ReasonActivationTimeout, fmt.Sprintf("no pod became ready within the progress deadline plus 30 s (%s); scaled back to 0", limit)}
			}
			return zeroOutcome{in.want, false, ReasonActivating, fmt.Sprintf("waiting for the first of %d pods to be ready", in.want)}
		}
		return zeroOutcome{in.want, true, ReasonActive, fmt.Sprintf("%d pods ready", in.ready)}
	}
	if in.current == 0 {
		return zeroOutcome{0, false, ReasonNoTraffic, "scaled to zero; the activator holds the next request"}
	}
	hold := func(reason, msg string) zeroOutcome { return zeroOutcome{1, true, reason, msg} }
	if !z.activeSince.IsZero() && in.now.Sub(z.activeSince) < in.s.StableWindow {
		return hold(ReasonWaitingToScaleDown, fmt.Sprintf("active since %s; a target stays active for a stable window (%s) before it may be idle", z.activeSince.UTC().Format(time.RFC3339), in.s.StableWindow))
	}
	idle := in.now.Sub(z.inactiveSince)
	// An unreachable target keeps no pod for the retention period (as in
	// Knative): nobody can be served by it.
	retention := in.s.ScaleToZeroPodRetentionPeriod
	if !in.reachable {
		retention = 0
	}
	grace := max(in.s.ScaleToZeroGracePeriod, retention)
	proxied := !z.proxySince.IsZero() && in.now.Sub(z.proxySince) >= in.s.ScaleToZeroGracePeriod
	if idle < retention || (idle < grace && !proxied) {
		return hold(ReasonWaitingToScaleDown, fmt.Sprintf("idle since %s; the last pod goes after %s idle", z.inactiveSince.UTC().Format(time.RFC3339), grace))
	}
	// Without a public Service no request can arrive, so there is nothing
	// for an activator to take over (Knative's unreachable Revisions still
	// have their Service; this case is sockscale's own).
	if in.noPath {
		return zeroOutcome{0, false, ReasonNoTraffic, "idle and no public Service: scaled to zero"}
	}
	if in.mode != v1alpha1.ModeProxy {
		return hold(ReasonWaitingForActivator, "the last pod stays until the public Service routes to an activator (no ready activator, or the switch to Proxy mode is pending)")
	}
	if in.s.TargetBurstCapacity != -1 && !in.activatorInPath() {
		return hold(ReasonWaitingForActivator, "the last pod stays until a probe of the public Service is answered by an activator")
	}
	return zeroOutcome{0, false, ReasonNoTraffic, "idle: scaled to zero; the activator holds the next request"}
}

// Prober tells whether requests to a public Service's port (0: the
// Service's first) reach an activator.
type Prober interface {
	ActivatorInPath(ctx context.Context, namespace, service string, port int32) (bool, error)
}

// defaultProgressDeadline is Kubernetes' default progress deadline of a
// Deployment, and the deadline of targets of other kinds, which have
// none sockscale can read.
const defaultProgressDeadline = 600 * time.Second

// progressDeadline is how long the Deployment may take to make progress.
func progressDeadline(d *appsv1.Deployment) time.Duration {
	if d.Spec.ProgressDeadlineSeconds != nil {
		return time.Duration(*d.Spec.ProgressDeadlineSeconds) * time.Second
	}
	return defaultProgressDeadline
}

// activatorInPath asks the Prober; an error is logged and counts as no.
func (r *PodAutoscaler) activatorInPath(ctx context.Context, ns string, svc v1alpha1.ServiceRef) bool {
	if r.Prober == nil {
		return false
	}
	ok, err := r.Prober.ActivatorInPath(ctx, ns, svc.Name, svc.Port)
	if err != nil {
		log.FromContext(ctx).V(1).Info("activator probe failed; keeping the last pod", "service", svc.Name, "error", err.Error())
	}
	return ok && err == nil
}
