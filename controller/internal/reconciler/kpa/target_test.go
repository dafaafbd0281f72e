package kpa

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/scaletarget"
)

// TestTargetRefusals: a scaleTargetRef that is malformed, names a kind the
// cluster does not allow, or a Deployment that is missing or selects by
// expressions gets the Ready reason that says so (other kinds are read
// through /scale: the integration tests).
func TestTargetRefusals(t *testing.T) {
	matchExpressions := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "expr"},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Exists"}}}}}
	rollouts := scaletarget.Kinds{scaletarget.Deployment, {Group: "argoproj.io", Kind: "Rollout"}}
	type refusal struct{ Reason, Message string }
	tests := []struct {
		name  string
		kinds scaletarget.Kinds
		ref   v1alpha1.ScaleTargetRef
		want  refusal
	}{
		{"a malformed apiVersion", nil, v1alpha1.ScaleTargetRef{APIVersion: "apps/v1/x", Kind: "Deployment", Name: "cart"},
			refusal{ReasonUnsupportedScaleTarget, `scaleTargetRef.apiVersion "apps/v1/x": want group/version`}},
		{"a kind not allowed by default", nil, v1alpha1.ScaleTargetRef{APIVersion: "argoproj.io/v1alpha1", Kind: "Rollout", Name: "cart"},
			refusal{ReasonScaleTargetNotAllowed, "scaleTargetRef argoproj.io/v1alpha1 Rollout: this cluster lets PodAutoscalers scale only Deployment.apps,StatefulSet.apps"}},
		{"StatefulSets taken off the list", rollouts, v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "db"},
			refusal{ReasonScaleTargetNotAllowed, "scale only Deployment.apps,Rollout.argoproj.io"}},
		{"a Deployment of another group is not a Deployment", nil, v1alpha1.ScaleTargetRef{APIVersion: "example.com/v1", Kind: "Deployment", Name: "cart"},
			refusal{ReasonScaleTargetNotAllowed, "scaleTargetRef example.com/v1 Deployment"}},
		{"a missing Deployment", nil, v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "gone"},
			refusal{ReasonScaleTargetNotFound, `Deployment "gone" does not exist in namespace "shop"`}},
		{"a Deployment selecting by expressions", nil, v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "expr"},
			refusal{ReasonUnsupportedSelector, `Deployment "expr": its selector must be matchLabels only`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &PodAutoscaler{Client: fake.NewClientBuilder().WithObjects(matchExpressions).Build(), ScaleTargetKinds: tt.kinds}
			pa := &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart"}, Spec: v1alpha1.PodAutoscalerSpec{ScaleTargetRef: tt.ref}}
			tgt, reason, msg := r.target(context.Background(), pa)
			if tgt != nil {
				t.Fatalf("target %s, want none", tgt)
			}
			if reason != tt.want.Reason || !strings.Contains(msg, tt.want.Message) {
				t.Errorf("%s: %s, want %s: ...%s...", reason, msg, tt.want.Reason, tt.want.Message)
			}
		})
	}
}

// TestDeploymentTarget: a Deployment's target is what the reconciler read
// of it before targets of other kinds existed.
func TestDeploymentTarget(t *testing.T) {
	d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart"},
		Spec: appsv1.DeploymentSpec{Replicas: new(int32(3)), ProgressDeadlineSeconds: new(int32(60)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "cart"}}},
		Status: appsv1.DeploymentStatus{ReadyReplicas: 2}}
	d.Spec.Template.Annotations = map[string]string{"autoscaling.knative.dev/target": "5"}
	got := deploymentTarget(d)
	want := &target{gvk: schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, name: "cart", replicas: 3, ready: 2,
		selector: map[string]string{"app": "cart"}, template: map[string]string{"autoscaling.knative.dev/target": "5"},
		progressDeadline: 60_000_000_000, deployment: d}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(target{})); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if got.String() != `Deployment "cart"` {
		t.Errorf("String() = %s", got)
	}
	d.Spec.Replicas = nil
	if got := deploymentTarget(d); got.replicas != 1 {
		t.Errorf("replicas unset: %d, want Kubernetes' default 1", got.replicas)
	}
}
