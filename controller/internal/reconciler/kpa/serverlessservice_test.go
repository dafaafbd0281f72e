package kpa

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
)

// TestPodAutoscalerRefusesAForeignServerlessService: a ServerlessService of
// the PodAutoscaler's name that it does not control is reported, not used.
func TestPodAutoscalerRefusesAForeignServerlessService(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	one := int32(1)
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec:       appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "hello"}}},
	}
	pa := &v1alpha1.PodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello", UID: "pa-uid"},
		Spec: v1alpha1.PodAutoscalerSpec{
			ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "hello"},
			Service:        v1alpha1.ServiceRef{Name: "hello"},
		},
	}
	foreign := &v1alpha1.ServerlessService{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeServe, PublicService: "other", Selector: map[string]string{"app": "other"}}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&v1alpha1.PodAutoscaler{}).WithObjects(deploy, pa, foreign).Build()
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	r := &PodAutoscaler{Client: c, Collector: collector.New(clk), Clock: clk, Config: config.Defaults}
	if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "hello"}}); err != nil {
		t.Fatal(err)
	}
	var got v1alpha1.PodAutoscaler
	_ = c.Get(context.Background(), client.ObjectKeyFromObject(pa), &got)
	cond := meta.FindStatusCondition(got.Status.Conditions, names.ConditionReady)
	if cond == nil || cond.Reason != names.ReasonNotOwned || !strings.Contains(cond.Message, `ServerlessService "hello" exists and is not controlled by PodAutoscaler "hello"`) {
		t.Errorf("Ready = %+v, want NotOwned naming the ServerlessService", cond)
	}
	var sks v1alpha1.ServerlessService
	_ = c.Get(context.Background(), client.ObjectKeyFromObject(foreign), &sks)
	if sks.Spec.PublicService != "other" || len(sks.OwnerReferences) > 0 {
		t.Errorf("the foreign ServerlessService was changed: %+v", sks)
	}
}
