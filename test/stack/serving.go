package stack

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

// PercentOf is rev's share of the Route's own address in status.traffic
// (tagged targets included).
func PercentOf(traffic []servingv1alpha1.TrafficTargetStatus, rev string) int64 {
	var sum int64
	for _, tt := range traffic {
		if tt.RevisionName == rev {
			sum += ptr.Deref(tt.Percent, 0)
		}
	}
	return sum
}

// TrafficLine is status.traffic in one line, e.g. "roll-00001 99%,
// roll-00002 1%" or, with tags, "current:tags-00002 100%, old:tags-00001 0%".
func TrafficLine(traffic []servingv1alpha1.TrafficTargetStatus) string {
	var parts []string
	for _, tt := range traffic {
		p := fmt.Sprintf("%s %d%%", tt.RevisionName, ptr.Deref(tt.Percent, 0))
		if tt.Tag != "" {
			p = tt.Tag + ":" + p
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}

// ConditionsLine is an object's status.conditions in one line, e.g.
// "Ready=False RevisionMissing: ...; ConfigurationsReady=True".
func ConditionsLine(cs []metav1.Condition) string {
	if len(cs) == 0 {
		return "no conditions"
	}
	var parts []string
	for _, c := range cs {
		p := fmt.Sprintf("%s=%s", c.Type, c.Status)
		if c.Status != metav1.ConditionTrue {
			p += fmt.Sprintf(" %s: %s", c.Reason, c.Message)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}
