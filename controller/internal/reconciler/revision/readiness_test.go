package revision

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/kpa"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
)

func cond(typ string, st metav1.ConditionStatus, reason string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: st, Reason: reason, Message: reason + " message"}
}

func TestReadiness(t *testing.T) {
	pa := func(cs ...metav1.Condition) *v1alpha1.PodAutoscaler {
		return &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Name: "hello-00001"}, Status: v1alpha1.PodAutoscalerStatus{Conditions: cs}}
	}
	sks := func(cs ...metav1.Condition) *v1alpha1.ServerlessService {
		return &v1alpha1.ServerlessService{ObjectMeta: metav1.ObjectMeta{Name: "hello-00001"}, Status: v1alpha1.ServerlessServiceStatus{Conditions: cs}}
	}
	ready := cond(names.ConditionReady, metav1.ConditionTrue, "Scaled")
	initialized := cond(kpa.ConditionInitialized, metav1.ConditionTrue, "Initialized")
	tests := []struct {
		name       string
		pa         *v1alpha1.PodAutoscaler
		sks        *v1alpha1.ServerlessService
		wantStatus metav1.ConditionStatus
		wantReason string
		wantMsg    string
	}{
		{"no PodAutoscaler", nil, nil, metav1.ConditionUnknown, ReasonDeploying, "the PodAutoscaler does not exist yet"},
		{"PodAutoscaler silent", pa(), nil, metav1.ConditionUnknown, ReasonDeploying, `PodAutoscaler "hello-00001" has not reported yet`},
		{"PodAutoscaler not ready", pa(cond(names.ConditionReady, metav1.ConditionFalse, "InvalidSettings")), nil,
			metav1.ConditionFalse, "InvalidSettings", `PodAutoscaler "hello-00001": InvalidSettings message`},
		{"Deployment failing", pa(ready, cond(kpa.ConditionReachable, metav1.ConditionFalse, kpa.ReasonScaleTargetFailing)), nil,
			metav1.ConditionFalse, kpa.ReasonScaleTargetFailing, `PodAutoscaler "hello-00001": ScaleTargetFailing message`},
		{"first pods not up", pa(ready, cond(kpa.ConditionInitialized, metav1.ConditionFalse, "Initializing")), nil,
			metav1.ConditionUnknown, "Initializing", `PodAutoscaler "hello-00001": Initializing message`},
		{"no ServerlessService", pa(ready, initialized), nil, metav1.ConditionUnknown, ReasonDeploying, `ServerlessService "hello-00001" does not exist yet`},
		{"ServerlessService not ready", pa(ready, initialized), sks(cond(names.ConditionReady, metav1.ConditionFalse, "NoEndpoints")),
			metav1.ConditionFalse, "NoEndpoints", `ServerlessService "hello-00001": NoEndpoints message`},
		{"ready", pa(ready, initialized), sks(cond(names.ConditionReady, metav1.ConditionTrue, "Serve")),
			metav1.ConditionTrue, ReasonReady, `PodAutoscaler "hello-00001" and ServerlessService "hello-00001" are ready`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, reason, msg := readiness(tt.pa, tt.sks)
			if st != tt.wantStatus || reason != tt.wantReason || msg != tt.wantMsg {
				t.Errorf("readiness = %s %s %q, want %s %s %q", st, reason, msg, tt.wantStatus, tt.wantReason, tt.wantMsg)
			}
		})
	}
}
