package route_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
	"github.com/sockscale/sockscale/controller/internal/reconciler/route"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// backend is one weighted backendRef as a test reads it.
type backend struct {
	Service string
	Port    int64
	Weight  int64
	Header  string // the Sockscale-Target header its filter sets
}

// httpRoute reads an HTTPRoute's host names and its one rule's backends.
func httpRoute(t *testing.T, u *unstructured.Unstructured) (hosts []string, parent string, backends []backend) {
	t.Helper()
	hs, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "hostnames")
	parents, _, _ := unstructured.NestedSlice(u.Object, "spec", "parentRefs")
	if len(parents) == 1 {
		p := parents[0].(map[string]any)
		parent = fmt.Sprintf("%s/%s %s", p["namespace"], p["name"], p["kind"])
	}
	rules, _, _ := unstructured.NestedSlice(u.Object, "spec", "rules")
	if len(rules) != 1 {
		t.Fatalf("HTTPRoute %s: %d rules, want 1", u.GetName(), len(rules))
	}
	refs, _, _ := unstructured.NestedSlice(rules[0].(map[string]any), "backendRefs")
	for _, r := range refs {
		m := r.(map[string]any)
		b := backend{Service: m["name"].(string), Port: m["port"].(int64), Weight: m["weight"].(int64)}
		if fs, _, _ := unstructured.NestedSlice(m, "filters"); len(fs) == 1 {
			set, _, _ := unstructured.NestedSlice(fs[0].(map[string]any), "requestHeaderModifier", "set")
			if len(set) == 1 && set[0].(map[string]any)["name"] == route.TargetHeader {
				b.Header = set[0].(map[string]any)["value"].(string)
			}
		}
		backends = append(backends, b)
	}
	return hs, parent, backends
}

// TestIntegrationHTTPRoutes: where the Gateway API is installed and a
// Gateway configured, a Route's address and each tag's get an HTTPRoute
// attached to it, with the external host name and the split as weighted
// backendRefs (each setting the target header for the activator); a
// changed split rewrites them, a removed tag's HTTPRoute goes, an
// HTTPRoute someone else owns is refused by name, and the URLs are
// external.
func TestIntegrationHTTPRoutes(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c, ctx := cl.Client, context.Background()
	cl.InstallHTTPRouteCRD(t)
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "sockscale-system"}}); err != nil {
		t.Fatal(err)
	}
	readyRevision(t, c, "hello-00001")
	readyRevision(t, c, "hello-00002")
	rt := &servingv1alpha1.Route{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: servingv1alpha1.RouteSpec{Traffic: []servingv1alpha1.TrafficTarget{
			{RevisionName: "hello-00002", Percent: pct(70), Tag: "next"},
			{RevisionName: "hello-00001", Percent: pct(30)},
		}}}
	if err := c.Create(ctx, rt); err != nil {
		t.Fatal(err)
	}
	r := &route.Reconciler{Client: c, ActivatorNamespace: "sockscale-system", ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}),
		ActivatorRoutePort: 8013, ClusterDomain: "cluster.local",
		HTTPRoutes: true, Gateway: &types.NamespacedName{Namespace: "gateway-system", Name: "public"}, Domain: "example.com"}
	reconcile := func() *servingv1alpha1.Route {
		t.Helper()
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key("hello")}); err != nil {
			t.Fatal(err)
		}
		var got servingv1alpha1.Route
		if err := c.Get(ctx, key("hello"), &got); err != nil {
			t.Fatal(err)
		}
		return &got
	}
	get := func(name string) (*unstructured.Unstructured, error) {
		u := route.NewHTTPRoute()
		return u, c.Get(ctx, key(name), u)
	}
	got := reconcile()
	if !meta.IsStatusConditionTrue(got.Status.Conditions, names.ConditionReady) || got.Status.URL != "http://hello.default.example.com" ||
		got.Status.Traffic[0].URL != "http://next-hello.default.example.com" || got.Status.Address.URL != "http://hello.default.svc.cluster.local" {
		t.Fatalf("status: %s url %s address %+v", describe(got), got.Status.URL, got.Status.Address)
	}
	check := func(name string, wantHosts []string, want []backend) {
		t.Helper()
		u, err := get(name)
		if err != nil {
			t.Fatalf("HTTPRoute %s: %v", name, err)
		}
		hosts, parent, backends := httpRoute(t, u)
		if diff := cmp.Diff(wantHosts, hosts); diff != "" {
			t.Errorf("HTTPRoute %s hostnames (-want +got):\n%s", name, diff)
		}
		if parent != "gateway-system/public Gateway" {
			t.Errorf("HTTPRoute %s parent %q", name, parent)
		}
		if diff := cmp.Diff(want, backends); diff != "" {
			t.Errorf("HTTPRoute %s backends (-want +got):\n%s", name, diff)
		}
		if u.GetLabels()[servingv1alpha1.RouteLabelKey] != "hello" || !metav1.IsControlledBy(u, got) {
			t.Errorf("HTTPRoute %s labels %v owners %v", name, u.GetLabels(), u.GetOwnerReferences())
		}
	}
	check("hello", []string{"hello.default.example.com"}, []backend{
		{"hello-00002", 80, 70, "default/hello-00002"}, {"hello-00001", 80, 30, "default/hello-00001"}})
	check("next-hello", []string{"next-hello.default.example.com"}, []backend{{"hello-00002", 80, 70, "default/hello-00002"}})

	// A new split without the tag: rewritten, the tag's HTTPRoute gone.
	got.Spec.Traffic = []servingv1alpha1.TrafficTarget{{RevisionName: "hello-00001", Percent: pct(100)}}
	if err := c.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	reconcile()
	check("hello", []string{"hello.default.example.com"}, []backend{{"hello-00001", 80, 100, "default/hello-00001"}})
	if _, err := get("next-hello"); !apierrors.IsNotFound(err) {
		t.Errorf("the removed tag's HTTPRoute: %v", err)
	}

	// Someone else's HTTPRoute of a tag's name: refused, naming it.
	foreign := route.NewHTTPRoute()
	foreign.SetNamespace("default")
	foreign.SetName("mine-hello")
	foreign.Object["spec"] = map[string]any{"hostnames": []any{"mine.example.com"}}
	if err := c.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	got = reconcile()
	got.Spec.Traffic[0].Tag = "mine"
	if err := c.Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	got = reconcile()
	ready := meta.FindStatusCondition(got.Status.Conditions, names.ConditionReady)
	if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != route.ReasonNotOwned || !strings.Contains(ready.Message, `HTTPRoute "mine-hello"`) {
		t.Errorf("Ready %+v", ready)
	}
	if u, _ := get("mine-hello"); u.GetLabels()[servingv1alpha1.RouteLabelKey] != "" {
		t.Errorf("the foreign HTTPRoute was taken over: %v", u.GetLabels())
	}
}
