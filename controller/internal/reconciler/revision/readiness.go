package revision

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/kpa"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
)

// ReasonDeploying is Ready's reason (Unknown) while the PodAutoscaler or
// its ServerlessService has not reported yet.
const ReasonDeploying = "Deploying"

// ReasonReady is Ready's reason when it is True.
const ReasonReady = "Ready"

// readiness is the Revision's Ready condition from its PodAutoscaler and
// ServerlessService (nil: not there yet). The first that is not ready
// gives its status, reason and message; a Deployment that cannot make
// pods (the PodAutoscaler's Reachable False, ScaleTargetFailing) is Ready
// False; a Revision whose first pods are not up yet (the PodAutoscaler's
// ScaleTargetInitialized not True) is Unknown, as in Knative, so that
// "latest ready" means a Revision whose pods came up. A Revision scaled
// to zero stays Ready. Ready True names no numbers (the PodAutoscaler's
// message changes with every stable value), so a steady Revision costs
// no status writes.
func readiness(pa *v1alpha1.PodAutoscaler, sks *v1alpha1.ServerlessService) (metav1.ConditionStatus, string, string) {
	if pa == nil {
		return metav1.ConditionUnknown, ReasonDeploying, "the PodAutoscaler does not exist yet"
	}
	paReady := meta.FindStatusCondition(pa.Status.Conditions, names.ConditionReady)
	if paReady == nil {
		return metav1.ConditionUnknown, ReasonDeploying, fmt.Sprintf("PodAutoscaler %q has not reported yet", pa.Name)
	}
	if paReady.Status != metav1.ConditionTrue {
		return paReady.Status, paReady.Reason, fmt.Sprintf("PodAutoscaler %q: %s", pa.Name, paReady.Message)
	}
	if c := meta.FindStatusCondition(pa.Status.Conditions, kpa.ConditionReachable); c != nil && c.Status == metav1.ConditionFalse && c.Reason == kpa.ReasonScaleTargetFailing {
		return metav1.ConditionFalse, c.Reason, fmt.Sprintf("PodAutoscaler %q: %s", pa.Name, c.Message)
	}
	if c := meta.FindStatusCondition(pa.Status.Conditions, kpa.ConditionInitialized); c == nil || c.Status != metav1.ConditionTrue {
		reason, msg := ReasonDeploying, "the first pods are not ready yet"
		if c != nil {
			reason, msg = c.Reason, c.Message
		}
		return metav1.ConditionUnknown, reason, fmt.Sprintf("PodAutoscaler %q: %s", pa.Name, msg)
	}
	if sks == nil {
		return metav1.ConditionUnknown, ReasonDeploying, fmt.Sprintf("ServerlessService %q does not exist yet", pa.Name)
	}
	sksReady := meta.FindStatusCondition(sks.Status.Conditions, names.ConditionReady)
	if sksReady == nil {
		return metav1.ConditionUnknown, ReasonDeploying, fmt.Sprintf("ServerlessService %q has not reported yet", sks.Name)
	}
	if sksReady.Status != metav1.ConditionTrue {
		return sksReady.Status, sksReady.Reason, fmt.Sprintf("ServerlessService %q: %s", sks.Name, sksReady.Message)
	}
	return metav1.ConditionTrue, ReasonReady, fmt.Sprintf("PodAutoscaler %q and ServerlessService %q are ready", pa.Name, sks.Name)
}
