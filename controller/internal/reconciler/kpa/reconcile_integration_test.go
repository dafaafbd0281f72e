package kpa_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"

	appsv1 "k8s.io/api/apps/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationPodAutoscalerScales drives the PodAutoscaler reconciler
// against a real kube-apiserver with scripted stats and a controlled clock.
func TestIntegrationPodAutoscalerScales(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c, ctx := cl.Client, context.Background()
	deploy := cl.CreateDeployment(t, "default", "hello", 1, 1)
	pa := &v1alpha1.PodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: v1alpha1.PodAutoscalerSpec{
			ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "hello"},
			Service:        v1alpha1.ServiceRef{Name: "hello"},
			MaxScale:       ptr.To(int32(10)),
		},
	}
	if err := c.Create(ctx, pa); err != nil {
		t.Fatal(err)
	}

	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	col := collector.New(clk)
	reg := prometheus.NewRegistry()
	r := &kpa.PodAutoscaler{Client: c, Collector: col, Clock: clk, Config: config.Defaults, Metrics: kpa.NewMetrics(reg)}
	// The collect reconciler registers the windows, as on every replica.
	cr := &collect.Reconciler{Client: c, Collector: col, Config: config.Defaults}
	reconcileOnce := func(name string) {
		t.Helper()
		if _, err := cr.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}}); err != nil {
			t.Fatalf("collect %s: %v", name, err)
		}
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}}); err != nil {
			t.Fatalf("reconcile %s: %v", name, err)
		}
	}
	// First tick: no stats yet, the scale stays.
	reconcileOnce("hello")
	replicas := func() int32 { return cl.Replicas(t, "default", "hello") }
	if got := replicas(); got != 1 {
		t.Fatalf("without stats the Deployment went to %d replicas", got)
	}
	assertCondition(t, c, "hello", names.ConditionReady, "NoData")

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
	want := `
# HELP sockscale_controller_desired_pods Pods the autoscaler wants for the target (after bounds).
# TYPE sockscale_controller_desired_pods gauge
sockscale_controller_desired_pods{namespace="default",podautoscaler="hello"} 2
# HELP sockscale_controller_stable_value The target's metric averaged over the stable window.
# TYPE sockscale_controller_stable_value gauge
sockscale_controller_stable_value{namespace="default",podautoscaler="hello"} 140
`
	if err := promtestutil.GatherAndCompare(reg, strings.NewReader(want), "sockscale_controller_desired_pods", "sockscale_controller_stable_value"); err != nil {
		t.Error(err)
	}

	// A bad annotation on the pod template is reported, not acted on.
	var d appsv1.Deployment
	_ = c.Get(ctx, client.ObjectKeyFromObject(deploy), &d)
	d.Spec.Template.Annotations = map[string]string{config.AnnotationPrefix + "window": "5s"}
	if err := c.Update(ctx, &d); err != nil {
		t.Fatal(err)
	}
	if _, err := cr.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "hello"}}); err != nil {
		t.Fatal(err)
	}
	res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "hello"}})
	if err != nil {
		t.Fatal(err)
	}
	cond := assertCondition(t, c, "hello", names.ConditionReady, "InvalidSettings")
	if !strings.Contains(cond.Message, `annotation "autoscaling.knative.dev/window": value "5s"`) {
		t.Errorf("message %q does not name the annotation and value", cond.Message)
	}
	// Nothing watched here fixes it (the Deployment's annotations, the
	// cluster's ConfigMap): it must be looked at again.
	if res.RequeueAfter <= 0 {
		t.Errorf("invalid settings: result %+v, want a RequeueAfter to look again once fixed", res)
	}

	// A PodAutoscaler whose Deployment does not exist says so.
	missing := pa.DeepCopy()
	missing.ObjectMeta = metav1.ObjectMeta{Namespace: "default", Name: "ghost"}
	missing.Spec.ScaleTargetRef.Name = "ghost"
	if err := c.Create(ctx, missing); err != nil {
		t.Fatal(err)
	}
	reconcileOnce("ghost")
	assertCondition(t, c, "ghost", names.ConditionReady, "ScaleTargetNotFound")
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

// TestIntegrationAccounting: a target whose pods report their load on
// connections counted per connection (a TLS target) shows status.accounting
// Connections, in the wide printer columns too, and gets one Warning event
// CountedPerConnection through the manager's recorder, as in main.
func TestIntegrationAccounting(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c, ctx := cl.Client, context.Background()
	cl.CreateDeployment(t, "default", "tls", 1, 1)
	pa := &v1alpha1.PodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "tls"},
		Spec: v1alpha1.PodAutoscalerSpec{
			ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "tls"},
			Service:        v1alpha1.ServiceRef{Name: "tls"},
		},
	}
	if err := c.Create(ctx, pa); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	col := collector.New(clk)
	r := &kpa.PodAutoscaler{Client: c, Collector: col, Clock: clk, Config: config.Defaults}
	cl.StartManager(t, func(mgr ctrl.Manager) error {
		r.Events = mgr.GetEventRecorder("sockscale-controller")
		return nil
	})
	cr := &collect.Reconciler{Client: c, Collector: col, Config: config.Defaults}
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "tls"}}
	reconcile := func() {
		t.Helper()
		if _, err := cr.Reconcile(ctx, req); err != nil {
			t.Fatalf("collect: %v", err)
		}
		if _, err := r.Reconcile(ctx, req); err != nil {
			t.Fatalf("reconcile: %v", err)
		}
	}
	accounting := func() v1alpha1.Accounting {
		t.Helper()
		var got v1alpha1.PodAutoscaler
		if err := c.Get(ctx, req.NamespacedName, &got); err != nil {
			t.Fatal(err)
		}
		return got.Status.Accounting
	}
	reconcile()
	if got := accounting(); got != "" {
		t.Errorf("before any stats: accounting %q, want none", got)
	}
	// Six seconds of 4 TLS connections in flight, each one request for
	// its whole life, on the target's pod; ticks in between.
	for s := range 6 {
		clk.Step(time.Second)
		col.RecordPods(&stats.Batch{Node: "node-a", Start: clk.Now().Add(-time.Second), Period: time.Second, Pods: []stats.PodStat{{
			IP: netip.MustParseAddr("10.0.0.7"), Namespace: "default", Pod: "tls-abc", Workload: "tls", Concurrency: 4, Requests: 0,
			Accounting: stats.AccountingConnections, OpaqueConcurrency: 4,
		}}})
		if s >= 3 {
			reconcile()
		}
	}
	if got := accounting(); got != v1alpha1.AccountingConnections {
		t.Fatalf("all load on TLS connections: accounting %q, want Connections", got)
	}
	if got := cl.TableRow(t, v1alpha1.GroupVersion, "podautoscalers", "default", "tls")["Accounting"]; got != "Connections" {
		t.Errorf("printer column Accounting %q, want Connections", got)
	}
	var warned []string
	testenv.Eventually(t, 30*time.Second, "a CountedPerConnection event on the PodAutoscaler", func() (bool, string) {
		var list eventsv1.EventList
		if err := c.List(ctx, &list, client.InNamespace("default")); err != nil {
			return false, err.Error()
		}
		warned = warned[:0]
		for _, e := range list.Items {
			if e.Reason == kpa.ReasonCountedPerConnection && e.Regarding.Name == "tls" && e.Regarding.Kind == "PodAutoscaler" {
				warned = append(warned, e.Type+": "+e.Note)
			}
		}
		return len(warned) > 0, fmt.Sprintf("%d events, %d of them CountedPerConnection", len(list.Items), len(warned))
	})
	// The manager's recorder may fold repeats into one event with a
	// count: the series says how many were emitted.
	var list eventsv1.EventList
	if err := c.List(ctx, &list, client.InNamespace("default")); err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Items {
		if e.Reason != kpa.ReasonCountedPerConnection {
			continue
		}
		if e.Type != "Warning" || !strings.Contains(e.Note, "terminate TLS before the pods or serve h2c") {
			t.Errorf("event %s %q, want a Warning that says what to do", e.Type, e.Note)
		}
		if len(warned) != 1 || e.Series != nil {
			t.Errorf("CountedPerConnection events %q (series %+v), want one, emitted once over 3 ticks", warned, e.Series)
		}
	}
}
