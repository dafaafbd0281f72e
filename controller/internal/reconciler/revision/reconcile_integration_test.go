package revision_test

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/kpa"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
	"github.com/sockscale/sockscale/controller/internal/reconciler/revision"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// startManager runs the Revision reconciler against cl until the test ends.
func startManager(t *testing.T, cl *testenv.Cluster) {
	t.Helper()
	cl.StartManager(t,
		func(mgr ctrl.Manager) error {
			return (&revision.Reconciler{Client: mgr.GetClient()}).SetupWithManager(mgr)
		})
}

// eventually waits up to 60 s for cond (testenv.Eventually).
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, what, cond)
}

func newRevision(name, image string) *servingv1alpha1.Revision {
	cc, timeout := int64(10), int64(60)
	return &servingv1alpha1.Revision{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
			Labels:      map[string]string{servingv1alpha1.ServiceLabelKey: "hello"},
			Annotations: map[string]string{"autoscaling.knative.dev/target": "7", "autoscaling.knative.dev/class": "kpa.autoscaling.knative.dev"}},
		Spec: servingv1alpha1.RevisionSpec{
			Containers:           []servingv1alpha1.Container{{Image: image}},
			ContainerConcurrency: &cc, TimeoutSeconds: &timeout,
		},
	}
}

func ready(t *testing.T, c client.Client, name string) (*servingv1alpha1.Revision, *metav1.Condition) {
	t.Helper()
	var rev servingv1alpha1.Revision
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: name}, &rev); err != nil {
		t.Fatal(err)
	}
	return &rev, meta.FindStatusCondition(rev.Status.Conditions, names.ConditionReady)
}

// TestIntegrationRevisionObjects: a Revision gets its Deployment, public
// Service and PodAutoscaler, controlled by it; a drifted Deployment and
// Service are corrected while the autoscaler's replicas stay; the status
// follows the PodAutoscaler and ServerlessService (written here by hand:
// their reconcilers do not run).
func TestIntegrationRevisionObjects(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c, ctx := cl.Client, context.Background()
	startManager(t, cl)
	rev := newRevision("hello-00001", "hello:v1")
	if err := c.Create(ctx, rev); err != nil {
		t.Fatal(err)
	}
	key := func(name string) types.NamespacedName { return types.NamespacedName{Namespace: "default", Name: name} }
	var d appsv1.Deployment
	var svc corev1.Service
	var pa v1alpha1.PodAutoscaler
	eventually(t, "the Revision's objects exist", func() (bool, string) {
		err1, err2, err3 := c.Get(ctx, key("hello-00001-deployment"), &d), c.Get(ctx, key("hello-00001"), &svc), c.Get(ctx, key("hello-00001"), &pa)
		return err1 == nil && err2 == nil && err3 == nil, strings.Join([]string{errString(err1), errString(err2), errString(err3)}, "; ")
	})
	for _, o := range []client.Object{&d, &svc, &pa} {
		if !metav1.IsControlledBy(o, rev) || o.GetLabels()[servingv1alpha1.RevisionLabelKey] != "hello-00001" || o.GetLabels()[servingv1alpha1.ServiceLabelKey] != "hello" {
			t.Errorf("%T %s: owners %v labels %v, want controlled by the Revision and labelled", o, o.GetName(), o.GetOwnerReferences(), o.GetLabels())
		}
	}
	pod := d.Spec.Template
	if pod.Spec.Containers[0].Image != "hello:v1" || pod.Spec.Containers[0].Ports[0].ContainerPort != 8080 ||
		pod.Annotations["autoscaling.knative.dev/target"] != "7" || pod.Annotations["autoscaling.knative.dev/class"] != "" {
		t.Errorf("pod template %+v: want image hello:v1, port 8080, the target annotation without the class", pod)
	}
	if len(svc.Spec.Selector) != 0 || svc.Spec.Type != corev1.ServiceTypeClusterIP || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 80 || svc.Spec.Ports[0].TargetPort.IntVal != 8080 {
		t.Errorf("public Service spec %+v: want ClusterIP, no selector, 80 -> 8080", svc.Spec)
	}
	if pa.Spec.ScaleTargetRef.Name != "hello-00001-deployment" || pa.Spec.Service != (v1alpha1.ServiceRef{Name: "hello-00001", Port: 80}) ||
		pa.Spec.ContainerConcurrency != 10 || pa.Spec.TimeoutSeconds == nil || *pa.Spec.TimeoutSeconds != 60 {
		t.Errorf("PodAutoscaler spec %+v", pa.Spec)
	}
	eventually(t, "status names the objects, Ready Unknown", func() (bool, string) {
		got, cond := ready(t, c, "hello-00001")
		s := got.Status
		ok := cond != nil && cond.Status == metav1.ConditionUnknown && s.DeploymentName == "hello-00001-deployment" && s.PodAutoscalerName == "hello-00001" &&
			s.ServiceName == "hello-00001" && s.PrivateServiceName == "hello-00001-private" && s.ObservedGeneration == got.Generation
		return ok, printStatus(s)
	})

	// The autoscaler scaled to 3 (through /scale) and someone changed the
	// image and put a selector on the public Service: both are put back,
	// the replicas stay.
	if err := c.Get(ctx, key("hello-00001-deployment"), &d); err != nil {
		t.Fatal(err)
	}
	d.Spec.Replicas = ptr.To(int32(3))
	d.Spec.Template.Spec.Containers[0].Image = "evil:latest"
	if err := c.Update(ctx, &d); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, key("hello-00001"), &svc); err != nil {
		t.Fatal(err)
	}
	svc.Spec.Selector = map[string]string{"app": "x"}
	if err := c.Update(ctx, &svc); err != nil {
		t.Fatal(err)
	}
	eventually(t, "drift corrected", func() (bool, string) {
		var d appsv1.Deployment
		var svc corev1.Service
		if err := c.Get(ctx, key("hello-00001-deployment"), &d); err != nil {
			return false, err.Error()
		}
		if err := c.Get(ctx, key("hello-00001"), &svc); err != nil {
			return false, err.Error()
		}
		img := d.Spec.Template.Spec.Containers[0].Image
		return img == "hello:v1" && *d.Spec.Replicas == 3 && len(svc.Spec.Selector) == 0,
			"image " + img + ", selector " + strings.Join(mapKeys(svc.Spec.Selector), ",")
	})
	// The Deployment is not rewritten when nothing drifted.
	if err := c.Get(ctx, key("hello-00001-deployment"), &d); err != nil {
		t.Fatal(err)
	}
	gen := d.Generation

	// The PodAutoscaler and ServerlessService report: the Revision follows.
	if err := c.Get(ctx, key("hello-00001"), &pa); err != nil {
		t.Fatal(err)
	}
	pa.Status.ActualScale, pa.Status.DesiredScale = ptr.To(int32(1)), ptr.To(int32(2))
	pa.Status.Conditions = []metav1.Condition{
		{Type: names.ConditionReady, Status: metav1.ConditionTrue, Reason: "ScalingUp", Message: "1 of 2 pods ready", LastTransitionTime: metav1.Now()},
		{Type: kpa.ConditionInitialized, Status: metav1.ConditionTrue, Reason: "Initialized", Message: "x", LastTransitionTime: metav1.Now()},
	}
	if err := c.Status().Update(ctx, &pa); err != nil {
		t.Fatal(err)
	}
	eventually(t, "replicas from the PodAutoscaler, Ready Unknown waiting for the ServerlessService", func() (bool, string) {
		got, cond := ready(t, c, "hello-00001")
		return cond != nil && cond.Status == metav1.ConditionUnknown && cond.Message == `ServerlessService "hello-00001" does not exist yet` &&
			got.Status.ActualReplicas != nil && *got.Status.ActualReplicas == 1 && *got.Status.DesiredReplicas == 2, printStatus(got.Status)
	})
	sks := &v1alpha1.ServerlessService{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello-00001"},
		Spec: v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeServe, PublicService: "hello-00001", Selector: map[string]string{"a": "b"}}}
	if err := c.Create(ctx, sks); err != nil {
		t.Fatal(err)
	}
	sks.Status.Conditions = []metav1.Condition{{Type: names.ConditionReady, Status: metav1.ConditionFalse, Reason: "NoEndpoints", Message: "no endpoint", LastTransitionTime: metav1.Now()}}
	if err := c.Status().Update(ctx, sks); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Ready False from the ServerlessService", func() (bool, string) {
		got, cond := ready(t, c, "hello-00001")
		return cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == "NoEndpoints" && cond.Message == `ServerlessService "hello-00001": no endpoint`, printStatus(got.Status)
	})
	sks.Status.Conditions[0].Status, sks.Status.Conditions[0].Reason = metav1.ConditionTrue, "Serve"
	if err := c.Status().Update(ctx, sks); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Ready True", func() (bool, string) {
		got, cond := ready(t, c, "hello-00001")
		return cond != nil && cond.Status == metav1.ConditionTrue && cond.Reason == revision.ReasonReady, printStatus(got.Status)
	})
	if err := c.Get(ctx, key("hello-00001-deployment"), &d); err != nil {
		t.Fatal(err)
	}
	if d.Generation != gen {
		t.Errorf("Deployment rewritten without drift: generation %d -> %d", gen, d.Generation)
	}
	// Nor the PodAutoscaler (its spec.metric is defaulted by the API
	// server; the Revision writes it out so the two agree).
	if err := c.Get(ctx, key("hello-00001"), &pa); err != nil {
		t.Fatal(err)
	}
	if pa.Generation != 1 {
		t.Errorf("PodAutoscaler rewritten without drift: generation %d", pa.Generation)
	}
}

// TestIntegrationRevisionDoesNotAdopt: a Deployment of the Revision's
// Deployment name made by someone else is left alone and the Revision
// says so.
func TestIntegrationRevisionDoesNotAdopt(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c, ctx := cl.Client, context.Background()
	foreign := cl.CreateDeployment(t, "default", "hello-00001-deployment", 1, 1)
	startManager(t, cl)
	if err := c.Create(ctx, newRevision("hello-00001", "hello:v1")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "Ready False NotOwned", func() (bool, string) {
		got, cond := ready(t, c, "hello-00001")
		return cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == names.ReasonNotOwned &&
			strings.Contains(cond.Message, `Deployment "hello-00001-deployment" exists and is not controlled by Revision "hello-00001"`), printStatus(got.Status)
	})
	var d appsv1.Deployment
	if err := c.Get(ctx, client.ObjectKeyFromObject(foreign), &d); err != nil {
		t.Fatal(err)
	}
	if len(d.OwnerReferences) != 0 || d.Spec.Template.Spec.Containers[0].Image != foreign.Spec.Template.Spec.Containers[0].Image || d.Generation != foreign.Generation {
		t.Errorf("the foreign Deployment was changed: owners %v, image %s, generation %d -> %d", d.OwnerReferences, d.Spec.Template.Spec.Containers[0].Image, foreign.Generation, d.Generation)
	}
}

func printStatus(s servingv1alpha1.RevisionStatus) string {
	var b strings.Builder
	for _, c := range s.Conditions {
		b.WriteString(c.Type + "=" + string(c.Status) + " " + c.Reason + ": " + c.Message + "; ")
	}
	b.WriteString("deployment=" + s.DeploymentName)
	return b.String()
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

func mapKeys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
