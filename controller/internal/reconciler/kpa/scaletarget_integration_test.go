package kpa_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/reconciler/collect"
	"github.com/sockscale/sockscale/controller/internal/reconciler/kpa"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
	"github.com/sockscale/sockscale/controller/internal/scaletarget"
	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// widgets is a test kind with a /scale subresource, as a custom workload
// (an Argo Rollout, say) has: spec.replicas, status.replicas and
// status.selector.
var widgets = schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Widget"}

// TestIntegrationScaleTargetKinds: a PodAutoscaler scales a StatefulSet,
// and a custom resource with /scale once its kind is allowed, through
// /scale (the replicas written, the private Service selecting the
// /scale's selector, the ready pods counted from its endpoints); a kind the
// controller is not allowed to scale, one without /scale, a selector that
// is not a label set, a missing target and a /scale the generated
// ClusterRole does not grant each get a Ready condition that says so.
func TestIntegrationScaleTargetKinds(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c, ctx := cl.Client, context.Background()
	installCRD(t, cl, widgets, true)
	installCRD(t, cl, schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Gadget"}, false)

	createStatefulSet(t, c, "db", 1)
	createWidget(t, c, "shop", 1, "app=shop")
	createWidget(t, c, "fancy", 1, "app in (fancy)")
	gadget := &unstructured.Unstructured{}
	gadget.SetGroupVersionKind(schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Gadget"})
	gadget.SetNamespace("default")
	gadget.SetName("toy")
	if err := c.Create(ctx, gadget); err != nil {
		t.Fatal(err)
	}
	// Each target has one ready pod on its private Service.
	for i, name := range []string{"db", "shop"} {
		readyEndpoint(t, c, name, netip.AddrFrom4([4]byte{10, 0, 0, byte(5 + i)}))
	}
	pa := func(name string, ref v1alpha1.ScaleTargetRef) {
		t.Helper()
		p := &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: v1alpha1.PodAutoscalerSpec{ScaleTargetRef: ref, Service: v1alpha1.ServiceRef{Name: ref.Name}, MaxScale: ptr.To(int32(10))}}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	pa("db", v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "db"})
	pa("shop", v1alpha1.ScaleTargetRef{APIVersion: "example.com/v1", Kind: "Widget", Name: "shop"})
	pa("fancy", v1alpha1.ScaleTargetRef{APIVersion: "example.com/v1", Kind: "Widget", Name: "fancy"})
	pa("toy", v1alpha1.ScaleTargetRef{APIVersion: "example.com/v1", Kind: "Gadget", Name: "toy"})
	pa("ghost", v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "ghost"})
	pa("rollout", v1alpha1.ScaleTargetRef{APIVersion: "argoproj.io/v1alpha1", Kind: "Rollout", Name: "web"})

	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	col := collector.New(clk)
	kinds := scaletarget.Kinds{scaletarget.Deployment, scaletarget.StatefulSet, widgets.GroupKind(), {Group: "example.com", Kind: "Gadget"}}
	disco, err := discovery.NewDiscoveryClientForConfig(cl.Config)
	if err != nil {
		t.Fatal(err)
	}
	r := &kpa.PodAutoscaler{Client: c, Collector: col, Clock: clk, Config: config.Defaults, ScaleTargetKinds: kinds, Discovery: disco}
	cr := &collect.Reconciler{Client: c, Collector: col, Config: config.Defaults, ScaleTargetKinds: kinds}
	reconcile := func(r *kpa.PodAutoscaler, name string) {
		t.Helper()
		req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}}
		if _, err := cr.Reconcile(ctx, req); err != nil {
			t.Fatalf("collect %s: %v", name, err)
		}
		if _, err := r.Reconcile(ctx, req); err != nil {
			t.Fatalf("reconcile %s: %v", name, err)
		}
	}
	for _, name := range []string{"db", "shop"} {
		reconcile(r, name)
	}
	// Six seconds of 140 requests in flight on each target's pod, reported
	// by the agents under the workload's name: 2 pods at the default
	// target of 70.
	for s := range 6 {
		for i, name := range []string{"db", "shop"} {
			col.RecordPods(&stats.Batch{Node: "node-a", Start: clk.Now(), Period: time.Second, Pods: []stats.PodStat{{
				IP: netip.AddrFrom4([4]byte{10, 0, 0, byte(5 + i)}), Namespace: "default", Pod: name + "-0", Workload: name, Concurrency: 140, Requests: 1400,
			}}})
		}
		if s < 5 {
			clk.Step(time.Second)
		}
	}
	for _, tt := range []struct {
		name string
		gvk  schema.GroupVersionKind
		sel  map[string]string
	}{
		{"db", appsv1.SchemeGroupVersion.WithKind("StatefulSet"), map[string]string{"app": "db"}},
		{"shop", widgets, map[string]string{"app": "shop"}},
	} {
		reconcile(r, tt.name)
		sc, err := scaletarget.Get(ctx, c, tt.gvk, "default", tt.name)
		if err != nil {
			t.Fatal(err)
		}
		if sc.Spec.Replicas != 2 {
			t.Errorf("%s %s: at 140 in flight on its one ready pod, %d replicas, want 2", tt.gvk.Kind, tt.name, sc.Spec.Replicas)
		}
		var sks v1alpha1.ServerlessService
		if err := c.Get(ctx, types.NamespacedName{Namespace: "default", Name: tt.name}, &sks); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tt.sel, sks.Spec.Selector); diff != "" {
			t.Errorf("%s %s: ServerlessService selector (-want +got):\n%s", tt.gvk.Kind, tt.name, diff)
		}
		// Its ready pod is counted from the private Service's endpoints.
		if cond := assertCondition(t, c, tt.name, names.ConditionReady, "ScalingUp"); cond.Message != "1 of 2 pods ready" {
			t.Errorf("%s %s: Ready says %q, want 1 of 2 pods ready", tt.gvk.Kind, tt.name, cond.Message)
		}
	}

	for _, tt := range []struct{ name, reason, message string }{
		{"fancy", kpa.ReasonUnsupportedSelector, `Widget "fancy": its /scale selector "app in (fancy)" is not equality only`},
		{"toy", kpa.ReasonUnsupportedScaleTarget, "the kind has no /scale subresource"},
		{"ghost", kpa.ReasonScaleTargetNotFound, `StatefulSet "ghost" does not exist in namespace "default"`},
		{"rollout", kpa.ReasonScaleTargetNotAllowed, "this cluster lets PodAutoscalers scale only Deployment.apps,StatefulSet.apps,Widget.example.com,Gadget.example.com"},
	} {
		reconcile(r, tt.name)
		if cond := assertCondition(t, c, tt.name, names.ConditionReady, tt.reason); !strings.Contains(cond.Message, tt.message) {
			t.Errorf("%s: message %q, want it to say %q", tt.name, cond.Message, tt.message)
		}
	}

	// Under the ClusterRole the chart gives the controller (its RBAC
	// markers), StatefulSets scale, and a custom kind allowed by the flag
	// but not granted says what the ClusterRole lacks.
	asController, err := client.New(cl.ConfigAs(t, "sockscale-controller", testenv.GeneratedRules(t, "role.yaml")), client.Options{Scheme: c.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	rc := &kpa.PodAutoscaler{Client: asController, Collector: col, Clock: clk, Config: config.Defaults, ScaleTargetKinds: kinds, Discovery: disco}
	reconcile(rc, "db")
	assertCondition(t, c, "db", names.ConditionReady, "ScalingUp")
	reconcile(rc, "shop")
	if cond := assertCondition(t, c, "shop", names.ConditionReady, kpa.ReasonScaleTargetForbidden); !strings.Contains(cond.Message, `the controller may not read the /scale of Widget "shop"`) {
		t.Errorf("shop: message %q does not say which /scale the controller may not read", cond.Message)
	}
}

// TestIntegrationStatefulSetHPAClass: the HPA class's HorizontalPodAutoscaler
// scales what the PodAutoscaler names, a StatefulSet here.
func TestIntegrationStatefulSetHPAClass(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c, ctx := cl.Client, context.Background()
	createStatefulSet(t, c, "db", 1)
	ref := v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "db"}
	p := &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "db"},
		Spec: v1alpha1.PodAutoscalerSpec{ScaleTargetRef: ref, Service: v1alpha1.ServiceRef{Name: "db"}, Class: v1alpha1.ClassHPA}}
	if err := c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	col := collector.New(clk)
	r := &kpa.PodAutoscaler{Client: c, Collector: col, Clock: clk, Config: config.Defaults}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKeyFromObject(p)}); err != nil {
		t.Fatal(err)
	}
	var hpa autoscalingv1.HorizontalPodAutoscaler
	if err := c.Get(ctx, client.ObjectKeyFromObject(p), &hpa); err != nil {
		t.Fatal(err)
	}
	want := autoscalingv1.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "db"}
	if diff := cmp.Diff(want, hpa.Spec.ScaleTargetRef); diff != "" {
		t.Errorf("the HPA's scaleTargetRef (-want +got):\n%s", diff)
	}
}

func createStatefulSet(t *testing.T, c client.Client, name string, replicas int32) {
	t.Helper()
	labels := map[string]string{"app": name}
	s := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: appsv1.StatefulSetSpec{Replicas: &replicas, ServiceName: name, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: name, Image: name}}}}}}
	if err := c.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

// createWidget makes a Widget with replicas wanted and status.selector
// selector (no controller of the kind runs to write it).
func createWidget(t *testing.T, c client.Client, name string, replicas int64, selector string) {
	t.Helper()
	ctx := context.Background()
	w := &unstructured.Unstructured{}
	w.SetGroupVersionKind(widgets)
	w.SetNamespace("default")
	w.SetName(name)
	_ = unstructured.SetNestedField(w.Object, replicas, "spec", "replicas")
	if err := c.Create(ctx, w); err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(w.Object, map[string]any{"replicas": replicas, "selector": selector}, "status")
	if err := c.Status().Update(ctx, w); err != nil {
		t.Fatal(err)
	}
}

// readyEndpoint gives the private Service of target's PodAutoscaler (named
// as the target) one ready endpoint at ip, as Kubernetes' EndpointSlice
// controller would for a ready pod.
func readyEndpoint(t *testing.T, c client.Client, target string, ip netip.Addr) {
	t.Helper()
	private := names.PrivateServiceName(target)
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: private + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: private}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{ip.String()}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName: ptr.To("node-a")}},
	}
	if err := c.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

// installCRD installs a namespaced kind with any spec and a status
// subresource, and a /scale one if scale, and waits until it is served.
func installCRD(t *testing.T, cl *testenv.Cluster, gvk schema.GroupVersionKind, scale bool) {
	t.Helper()
	s := kruntime.NewScheme()
	if err := apiextensionsv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cl.Config, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	plural := strings.ToLower(gvk.Kind) + "s"
	sub := &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}}
	if scale {
		sub.Scale = &apiextensionsv1.CustomResourceSubresourceScale{SpecReplicasPath: ".spec.replicas", StatusReplicasPath: ".status.replicas",
			LabelSelectorPath: ptr.To(".status.selector")}
	}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + gvk.Group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: gvk.Group, Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: plural, Singular: strings.ToLower(gvk.Kind), Kind: gvk.Kind, ListKind: gvk.Kind + "List"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: gvk.Version, Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", XPreserveUnknownFields: ptr.To(true)}},
				Subresources: sub}},
		},
	}
	ctx := context.Background()
	if err := c.Create(ctx, crd); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "CRD "+crd.Name+" is served", func() (bool, string) {
		var got apiextensionsv1.CustomResourceDefinition
		if err := c.Get(ctx, client.ObjectKey{Name: crd.Name}, &got); err != nil {
			return false, err.Error()
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, ""
			}
		}
		return false, "not established yet"
	})
}
