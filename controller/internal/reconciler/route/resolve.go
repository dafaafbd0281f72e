package route

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
)

// Reasons of a Route's conditions.
const (
	// ReasonReady: every target resolved and the split is in effect.
	ReasonReady = "Ready"
	// ReasonRevisionMissing: a target names a Revision that does not
	// exist. The last good split stays in effect.
	ReasonRevisionMissing = "RevisionMissing"
	// ReasonConfigurationMissing: a configurationName names no Service.
	ReasonConfigurationMissing = "ConfigurationMissing"
	// ReasonNoReadyRevision: a configurationName's Service has no ready
	// Revision yet (Unknown: it may become ready).
	ReasonNoReadyRevision = "NoReadyRevision"
	// ReasonTagAddressTooLong: <tag>-<route> is longer than a Service
	// name may be.
	ReasonTagAddressTooLong = "TagAddressTooLong"
	// ReasonRolloutInProgress: a gradual rollout moves traffic to the
	// latest Revision; status.traffic is its current step.
	ReasonRolloutInProgress = "RolloutInProgress"
	// ReasonNotOwned: a Kubernetes Service or HTTPRoute the Route needs
	// exists and belongs to someone else.
	ReasonNotOwned = names.ReasonNotOwned
	// ReasonHTTPRouteInvalid: the API server refused an HTTPRoute (e.g. a
	// host name the Gateway API does not accept).
	ReasonHTTPRouteInvalid = "HTTPRouteInvalid"
)

// problem is why a split cannot be resolved: status False (needs a
// person) or Unknown (may resolve by itself).
type problem struct {
	status  metav1.ConditionStatus
	reason  string
	message string
}

func (p *problem) Error() string { return p.reason + ": " + p.message }

// Resolve names each target's Revision: a revisionName must exist; a
// configurationName follows its Service's latest ready Revision (and
// keeps the configurationName, so a rollout can group by it). Percent
// nil stays nil (0). The first target that cannot be resolved is the
// problem, and no split is returned.
func Resolve(traffic []servingv1alpha1.TrafficTarget, revisions map[string]*servingv1alpha1.Revision, services map[string]*servingv1alpha1.Service) ([]servingv1alpha1.TrafficTargetStatus, *problem) {
	out := make([]servingv1alpha1.TrafficTargetStatus, 0, len(traffic))
	for i, t := range traffic {
		s := servingv1alpha1.TrafficTargetStatus{Tag: t.Tag, RevisionName: t.RevisionName, LatestRevision: ptr.To(false)}
		if t.Percent != nil {
			s.Percent = ptr.To(*t.Percent)
		}
		switch {
		case t.RevisionName != "":
			if _, ok := revisions[t.RevisionName]; !ok {
				return nil, &problem{metav1.ConditionFalse, ReasonRevisionMissing,
					fmt.Sprintf("spec.traffic[%d] names Revision %q, which does not exist", i, t.RevisionName)}
			}
		default:
			svc, ok := services[t.ConfigurationName]
			if !ok {
				return nil, &problem{metav1.ConditionFalse, ReasonConfigurationMissing,
					fmt.Sprintf("spec.traffic[%d].configurationName names Service %q, which does not exist", i, t.ConfigurationName)}
			}
			latest := svc.Status.LatestReadyRevisionName
			if latest == "" {
				return nil, &problem{metav1.ConditionUnknown, ReasonNoReadyRevision,
					fmt.Sprintf("spec.traffic[%d] follows the latest ready Revision of Service %q, which has none yet", i, t.ConfigurationName)}
			}
			if _, ok := revisions[latest]; !ok {
				// The Service's status is ahead of the cache or names a
				// deleted Revision: wait for the Service to catch up.
				return nil, &problem{metav1.ConditionUnknown, ReasonRevisionMissing,
					fmt.Sprintf("spec.traffic[%d] follows Service %q, whose latest ready Revision %q does not exist", i, t.ConfigurationName, latest)}
			}
			s.ConfigurationName, s.RevisionName, s.LatestRevision = t.ConfigurationName, latest, ptr.To(true)
		}
		out = append(out, s)
	}
	return out, nil
}
