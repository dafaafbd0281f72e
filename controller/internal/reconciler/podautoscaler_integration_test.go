package reconciler_test

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/sockscale/sockscale/agent/stats"
	"github.com/sockscale/sockscale/controller/api/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/reconciler"
	"github.com/sockscale/sockscale/internal/testenv"
)

// TestIntegrationPodAutoscalerScales drives the PodAutoscaler reconciler
// against a real kube-apiserver with scripted stats and a controlled clock.
func TestIntegrationPodAutoscalerScales(t *testing.T) {
	testenv.RequireControlPlane(t)
	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "..", "..", "charts", "sockscale", "crds")}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start etcd and kube-apiserver: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "hello"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "hello"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "hello", Image: "hello"}}},
			},
		},
	}
	if err := c.Create(ctx, deploy); err != nil {
		t.Fatal(err)
	}
	deploy.Status.Replicas, deploy.Status.ReadyReplicas = 1, 1
	if err := c.Status().Update(ctx, deploy); err != nil {
		t.Fatal(err)
	}
	pa := &v1alpha1.PodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: v1alpha1.PodAutoscalerSpec{
			ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "hello"},
			Service:        v1alpha1.ServiceRef{Name: "hello"},
			MaxScale:       ptr(int32(10)),
		},
	}
	if err := c.Create(ctx, pa); err != nil {
		t.Fatal(err)
	}

	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	col := collector.New()
	r := &reconciler.PodAutoscaler{Client: c, Collector: col, Clock: clk, Config: config.Defaults}
	reconcileOnce := func(name string) {
		t.Helper()
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}}); err != nil {
			t.Fatalf("reconcile %s: %v", name, err)
		}
	}
	// First tick: no stats yet, the scale stays.
	reconcileOnce("hello")
	replicas := func() int32 {
		t.Helper()
		var d appsv1.Deployment
		if err := c.Get(ctx, client.ObjectKeyFromObject(deploy), &d); err != nil {
			t.Fatal(err)
		}
		return *d.Spec.Replicas
	}
	if got := replicas(); got != 1 {
		t.Fatalf("without stats the Deployment went to %d replicas", got)
	}
	assertCondition(t, c, "hello", reconciler.ConditionReady, "NoData")

	// Six seconds of 140 requests in flight on its pod: at the default
	// target of 70 per pod that is 2 pods.
	for s := range 6 {
		col.RecordPods(&stats.Batch{Node: "node-a", Start: clk.Now(), Period: time.Second, Pods: []stats.PodStat{{
			IP: netip.MustParseAddr("10.0.0.5"), Namespace: "default", Pod: "hello-abc", Workload: "hello", Concurrency: 140, Requests: 1400,
		}}})
		if s < 5 {
			clk.Step(time.Second)
		}
	}
	reconcileOnce("hello")
	if got := replicas(); got != 2 {
		t.Errorf("at 140 in flight the Deployment has %d replicas, want 2", got)
	}
	var got v1alpha1.PodAutoscaler
	if err := c.Get(ctx, client.ObjectKeyFromObject(pa), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.DesiredScale == nil || *got.Status.DesiredScale != 2 || got.Status.StableValue != "140.000" {
		t.Errorf("status desired %v stable %q, want 2 and 140.000", got.Status.DesiredScale, got.Status.StableValue)
	}

	// A bad annotation on the pod template is reported, not acted on.
	var d appsv1.Deployment
	_ = c.Get(ctx, client.ObjectKeyFromObject(deploy), &d)
	d.Spec.Template.Annotations = map[string]string{config.AnnotationPrefix + "window": "5s"}
	if err := c.Update(ctx, &d); err != nil {
		t.Fatal(err)
	}
	reconcileOnce("hello")
	cond := assertCondition(t, c, "hello", reconciler.ConditionReady, "InvalidSettings")
	if !strings.Contains(cond.Message, `annotation "autoscaling.knative.dev/window": value "5s"`) {
		t.Errorf("message %q does not name the annotation and value", cond.Message)
	}

	// A PodAutoscaler whose Deployment does not exist says so.
	missing := pa.DeepCopy()
	missing.ObjectMeta = metav1.ObjectMeta{Namespace: "default", Name: "ghost"}
	missing.Spec.ScaleTargetRef.Name = "ghost"
	if err := c.Create(ctx, missing); err != nil {
		t.Fatal(err)
	}
	reconcileOnce("ghost")
	assertCondition(t, c, "ghost", reconciler.ConditionReady, "ScaleTargetNotFound")
}

func assertCondition(t *testing.T, c client.Client, name, typ, reason string) metav1.Condition {
	t.Helper()
	var pa v1alpha1.PodAutoscaler
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: name}, &pa); err != nil {
		t.Fatal(err)
	}
	cond := meta.FindStatusCondition(pa.Status.Conditions, typ)
	if cond == nil || cond.Reason != reason {
		t.Fatalf("%s condition %s = %+v, want reason %s", name, typ, cond, reason)
	}
	return *cond
}

func ptr[T any](v T) *T { return &v }
