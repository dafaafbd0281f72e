package kpa

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

func TestReachable(t *testing.T) {
	pa := &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: v1alpha1.PodAutoscalerSpec{Service: v1alpha1.ServiceRef{Name: "hello"}}}
	public := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"}}
	deploy := func(replicas, ready int32, conds ...appsv1.DeploymentCondition) *appsv1.Deployment {
		return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
			Spec: appsv1.DeploymentSpec{Replicas: &replicas}, Status: appsv1.DeploymentStatus{ReadyReplicas: ready, Conditions: conds}}
	}
	deadline := appsv1.DeploymentCondition{Type: appsv1.DeploymentProgressing, Status: corev1.ConditionFalse, Reason: "ProgressDeadlineExceeded", Message: "took too long"}
	quota := appsv1.DeploymentCondition{Type: appsv1.DeploymentReplicaFailure, Status: corev1.ConditionTrue, Reason: "FailedCreate", Message: "exceeded quota"}
	type result struct {
		OK, NoPath bool
		Reason     string
	}
	tests := []struct {
		name    string
		objects []client.Object
		deploy  *appsv1.Deployment
		want    result
	}{
		{"the public Service exists", []client.Object{public}, deploy(1, 1), result{OK: true, Reason: ReasonReachable}},
		{"no public Service", nil, deploy(1, 1), result{NoPath: true, Reason: ReasonNoPublicService}},
		{"no pod ready past the progress deadline", []client.Object{public}, deploy(2, 0, deadline), result{Reason: ReasonScaleTargetFailing}},
		{"pods cannot be created", []client.Object{public}, deploy(2, 0, quota), result{Reason: ReasonScaleTargetFailing}},
		{"a failed rollout with a ready pod still serves", []client.Object{public}, deploy(2, 1, deadline), result{OK: true, Reason: ReasonReachable}},
		{"at zero nothing fails", []client.Object{public}, deploy(0, 0, deadline), result{OK: true, Reason: ReasonReachable}},
		{"starting, not failed yet", []client.Object{public}, deploy(2, 0), result{OK: true, Reason: ReasonReachable}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &PodAutoscaler{Client: fake.NewClientBuilder().WithObjects(tt.objects...).Build()}
			got := r.reachable(context.Background(), pa, deploymentTarget(tt.deploy))
			if diff := cmp.Diff(tt.want, result{got.ok, got.noPath, got.reason}); diff != "" {
				t.Errorf("(-want +got):\n%s\nmessage: %s", diff, got.message)
			}
		})
	}
	// A Revision no Route sends traffic to: unreachable, though its
	// public Service exists; a missing Service still says there is no
	// path at all.
	unrouted := pa.DeepCopy()
	unrouted.Spec.Reachability = v1alpha1.ReachabilityUnreachable
	for _, tt := range []struct {
		name    string
		objects []client.Object
		want    result
	}{
		{"not routed", []client.Object{public}, result{Reason: ReasonNotRouted}},
		{"not routed, no public Service", nil, result{NoPath: true, Reason: ReasonNoPublicService}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := &PodAutoscaler{Client: fake.NewClientBuilder().WithObjects(tt.objects...).Build()}
			got := r.reachable(context.Background(), unrouted, deploymentTarget(deploy(1, 1)))
			if diff := cmp.Diff(tt.want, result{got.ok, got.noPath, got.reason}); diff != "" {
				t.Errorf("(-want +got):\n%s\nmessage: %s", diff, got.message)
			}
		})
	}
}
