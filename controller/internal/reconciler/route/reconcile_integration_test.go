package route_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
	"github.com/sockscale/sockscale/controller/internal/reconciler/route"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

func key(name string) types.NamespacedName {
	return types.NamespacedName{Namespace: "default", Name: name}
}

func pct(v int64) *int64 { return &v }

func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, what, cond)
}

// readyRevision creates a Revision that reports Ready (no Revision
// reconciler runs here).
func readyRevision(t *testing.T, c client.Client, name string) {
	t.Helper()
	ctx := context.Background()
	rev := &servingv1alpha1.Revision{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: servingv1alpha1.RevisionSpec{Containers: []servingv1alpha1.Container{{Image: "hello"}}}}
	if err := c.Create(ctx, rev); err != nil {
		t.Fatal(err)
	}
	rev.Status.Conditions = []metav1.Condition{{Type: names.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready", Message: "up", LastTransitionTime: metav1.Now()}}
	if err := c.Status().Update(ctx, rev); err != nil {
		t.Fatal(err)
	}
}

func describe(rt *servingv1alpha1.Route) string {
	var b strings.Builder
	for _, c := range rt.Status.Conditions {
		fmt.Fprintf(&b, "%s=%s %s: %s; ", c.Type, c.Status, c.Reason, c.Message)
	}
	for _, tt := range rt.Status.Traffic {
		fmt.Fprintf(&b, "[%s %s %d%% tag=%s %s] ", tt.ConfigurationName, tt.RevisionName, *tt.Percent, tt.Tag, tt.URL)
	}
	return b.String()
}

// TestIntegrationRoute: a Route over a Service's latest ready Revision
// and a pinned, tagged one resolves both, gets its own address and the
// tag's (ClusterIP Services without selector whose endpoints are the
// activators' route port), follows the Service's latest ready Revision,
// drops a removed tag's address, keeps the last good split when a target
// goes missing, and refuses an address someone else owns.
func TestIntegrationRoute(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c, ctx := cl.Client, context.Background()
	cl.StartManager(t, func(mgr ctrl.Manager) error {
		return (&route.Reconciler{Client: mgr.GetClient(), ActivatorNamespace: "sockscale-system", ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}),
			ActivatorRoutePort: 8013, ClusterDomain: "cluster.local"}).SetupWithManager(mgr)
	})
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "sockscale-system"}}); err != nil {
		t.Fatal(err)
	}
	act := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "sockscale-system", Name: "activator-0", Labels: map[string]string{"app": "activator"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Image: "activator"}}}}
	if err := c.Create(ctx, act); err != nil {
		t.Fatal(err)
	}
	act.Status = corev1.PodStatus{PodIP: "10.9.0.7", PodIPs: []corev1.PodIP{{IP: "10.9.0.7"}}, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := c.Status().Update(ctx, act); err != nil {
		t.Fatal(err)
	}
	readyRevision(t, c, "hello-00001")
	readyRevision(t, c, "hello-00002")
	svc := &servingv1alpha1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: servingv1alpha1.ServiceSpec{Template: servingv1alpha1.RevisionTemplateSpec{Spec: servingv1alpha1.RevisionSpec{Containers: []servingv1alpha1.Container{{Image: "hello"}}}}}}
	if err := c.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	svc.Status.LatestReadyRevisionName = "hello-00001"
	if err := c.Status().Update(ctx, svc); err != nil {
		t.Fatal(err)
	}

	rt := &servingv1alpha1.Route{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "split"},
		Spec: servingv1alpha1.RouteSpec{Traffic: []servingv1alpha1.TrafficTarget{
			{ConfigurationName: "hello", Percent: pct(70)},
			{RevisionName: "hello-00001", Percent: pct(30), Tag: "old"},
		}}}
	if err := c.Create(ctx, rt); err != nil {
		t.Fatal(err)
	}
	get := func() *servingv1alpha1.Route {
		var got servingv1alpha1.Route
		if err := c.Get(ctx, key("split"), &got); err != nil {
			t.Fatal(err)
		}
		return &got
	}
	ready := func(got *servingv1alpha1.Route) bool {
		return meta.IsStatusConditionTrue(got.Status.Conditions, names.ConditionReady) && got.Status.ObservedGeneration == got.Generation
	}
	eventually(t, "the split resolved", func() (bool, string) {
		got := get()
		tr := got.Status.Traffic
		return ready(got) && len(tr) == 2 && tr[0].RevisionName == "hello-00001" && *tr[0].LatestRevision && *tr[0].Percent == 70 &&
			tr[1].RevisionName == "hello-00001" && tr[1].Tag == "old" && tr[1].URL == "http://old-split.default.svc.cluster.local" &&
			got.Status.URL == "http://split.default.svc.cluster.local", describe(got)
	})
	for _, name := range []string{"split", "old-split"} {
		var s corev1.Service
		if err := c.Get(ctx, key(name), &s); err != nil {
			t.Fatal(err)
		}
		if s.Spec.Selector != nil || s.Spec.Type != corev1.ServiceTypeClusterIP || len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Port != 80 ||
			s.Spec.Ports[0].TargetPort.IntValue() != 8013 || s.Labels[servingv1alpha1.RouteLabelKey] != "split" {
			t.Errorf("Service %s: %+v labels %v", name, s.Spec, s.Labels)
		}
		if tag := s.Labels[servingv1alpha1.TagLabelKey]; (name == "old-split") != (tag == "old") {
			t.Errorf("Service %s has tag label %q", name, tag)
		}
		eventually(t, "the activator behind "+name, func() (bool, string) {
			var es discoveryv1.EndpointSlice
			err := c.Get(ctx, key(name+"-sockscale-0"), &es)
			ok := err == nil && es.Labels[discoveryv1.LabelServiceName] == name && len(es.Endpoints) == 1 && es.Endpoints[0].Addresses[0] == "10.9.0.7" &&
				len(es.Ports) == 1 && *es.Ports[0].Port == 8013 && *es.Ports[0].Name == "http"
			return ok, fmt.Sprintf("%v %+v", err, es)
		})
	}

	// The Service's latest ready Revision moves: the split follows.
	svc.Status.LatestReadyRevisionName = "hello-00002"
	if err := c.Status().Update(ctx, svc); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the latest target follows hello-00002", func() (bool, string) {
		got := get()
		return ready(got) && got.Status.Traffic[0].RevisionName == "hello-00002" && got.Status.Traffic[1].RevisionName == "hello-00001", describe(got)
	})

	// setTraffic changes the Route's spec, again on a conflict (the
	// reconciler patches the Route's rollout annotation meanwhile).
	setTraffic := func(traffic ...servingv1alpha1.TrafficTarget) {
		t.Helper()
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			got := get()
			got.Spec.Traffic = traffic
			return c.Update(ctx, got)
		}); err != nil {
			t.Fatal(err)
		}
	}

	// The tag goes: so does its address.
	setTraffic(servingv1alpha1.TrafficTarget{ConfigurationName: "hello", Percent: pct(70)}, servingv1alpha1.TrafficTarget{RevisionName: "hello-00001", Percent: pct(30)})
	eventually(t, "old-split removed", func() (bool, string) {
		var s corev1.Service
		err := c.Get(ctx, key("old-split"), &s)
		return apierrors.IsNotFound(err) && ready(get()), fmt.Sprint(err, describe(get()))
	})

	// A target goes missing: Ready False naming it, the last split kept.
	setTraffic(servingv1alpha1.TrafficTarget{RevisionName: "hello-00009", Percent: pct(100)})
	eventually(t, "RevisionMissing, last split kept", func() (bool, string) {
		got := get()
		c := meta.FindStatusCondition(got.Status.Conditions, names.ConditionReady)
		return got.Status.ObservedGeneration == got.Generation && c != nil && c.Status == metav1.ConditionFalse && c.Reason == route.ReasonRevisionMissing &&
			strings.Contains(c.Message, `"hello-00009"`) && len(got.Status.Traffic) == 2 && got.Status.Traffic[0].RevisionName == "hello-00002", describe(got)
	})

	// An address someone else owns is refused, naming it.
	if err := c.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "taken"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &servingv1alpha1.Route{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "taken"},
		Spec: servingv1alpha1.RouteSpec{Traffic: []servingv1alpha1.TrafficTarget{{RevisionName: "hello-00001", Percent: pct(100)}}}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "taken refused", func() (bool, string) {
		var got servingv1alpha1.Route
		if err := c.Get(ctx, key("taken"), &got); err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(got.Status.Conditions, names.ConditionReady)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == route.ReasonNotOwned && strings.Contains(c.Message, `Service "taken"`), describe(&got)
	})
}
