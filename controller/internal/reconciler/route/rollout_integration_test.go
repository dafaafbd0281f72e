package route_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
	"github.com/sockscale/sockscale/controller/internal/reconciler/route"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationGradualRollout is the worked example through a
// real API server, with the clock driven by the test: traffic is 55 %
// latest + 45 % pinned config-00005 with rollout-duration 120s. A new
// latest revision config-00006 gets 1 %; its first step is seen in effect
// 30 s later, which sets the pace: (120-30)/30 = 3 steps of
// round(54/3) = 18 % every 30 s, so 1 -> 19 -> 37 -> 55 while the pinned
// 45 % never moves. Ready is Unknown, RolloutInProgress, until the end.
func TestIntegrationGradualRollout(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c, ctx := cl.Client, context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "sockscale-system"}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"config-00005", "config-00006"} {
		readyRevision(t, c, name)
	}
	svc := &servingv1alpha1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "config"},
		Spec: servingv1alpha1.ServiceSpec{Template: servingv1alpha1.RevisionTemplateSpec{Spec: servingv1alpha1.RevisionSpec{Containers: []servingv1alpha1.Container{{Image: "hello"}}}}}}
	if err := c.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	svc.Status.LatestReadyRevisionName = "config-00005"
	if err := c.Status().Update(ctx, svc); err != nil {
		t.Fatal(err)
	}
	rt := &servingv1alpha1.Route{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "config",
		Annotations: map[string]string{servingv1alpha1.RolloutDurationAnnotation: "120s"}},
		Spec: servingv1alpha1.RouteSpec{Traffic: []servingv1alpha1.TrafficTarget{
			{ConfigurationName: "config", Percent: pct(55)},
			{RevisionName: "config-00005", Percent: pct(45)},
		}}}
	if err := c.Create(ctx, rt); err != nil {
		t.Fatal(err)
	}

	t0 := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakePassiveClock(t0)
	r := &route.Reconciler{Client: c, ActivatorNamespace: "sockscale-system", ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}),
		ActivatorRoutePort: 8013, ClusterDomain: "cluster.local", Clock: clk}
	type share struct {
		Revision string
		Latest   bool
		Percent  int64
	}
	// at reconciles at t0+offset and checks the split in status, Ready's
	// reason, and when the reconciler wants to look again.
	at := func(offset time.Duration, want []share, wantReason string, wantRequeue time.Duration) {
		t.Helper()
		clk.SetTime(t0.Add(offset))
		res, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key("config")})
		if err != nil {
			t.Fatalf("at +%s: %v", offset, err)
		}
		var got servingv1alpha1.Route
		if err := c.Get(ctx, key("config"), &got); err != nil {
			t.Fatal(err)
		}
		var shares []share
		for _, tt := range got.Status.Traffic {
			shares = append(shares, share{tt.RevisionName, *tt.LatestRevision, *tt.Percent})
		}
		if diff := cmp.Diff(want, shares); diff != "" {
			t.Errorf("at +%s: status.traffic (-want +got):\n%s", offset, diff)
		}
		ready := meta.FindStatusCondition(got.Status.Conditions, names.ConditionReady)
		if ready == nil || ready.Reason != wantReason {
			t.Errorf("at +%s: Ready %v, want reason %s", offset, ready, wantReason)
		} else if wantReason == route.ReasonRolloutInProgress && (ready.Status != metav1.ConditionUnknown || ready.Message != "A gradual rollout of the latest revision(s) is in progress.") {
			t.Errorf("at +%s: Ready %s %q", offset, ready.Status, ready.Message)
		}
		if res.RequeueAfter != wantRequeue {
			t.Errorf("at +%s: requeue after %s, want %s", offset, res.RequeueAfter, wantRequeue)
		}
	}
	old := func(p int64) share { return share{"config-00005", true, p} }
	pinned := share{"config-00005", false, 45}
	fresh := func(p int64) share { return share{"config-00006", true, p} }

	// First look: no earlier state, the goal at once.
	at(0, []share{old(55), pinned}, route.ReasonReady, 0)
	at(time.Second, []share{old(55), pinned}, route.ReasonReady, 0) // nothing moves by itself

	svc.Status.LatestReadyRevisionName = "config-00006"
	if err := c.Status().Update(ctx, svc); err != nil {
		t.Fatal(err)
	}
	at(10*time.Second, []share{old(54), fresh(1), pinned}, route.ReasonRolloutInProgress, time.Second)
	// 30 s later the 1 % is seen in effect: the pace is set, nothing moves yet.
	at(40*time.Second, []share{old(54), fresh(1), pinned}, route.ReasonRolloutInProgress, 30*time.Second)
	at(55*time.Second, []share{old(54), fresh(1), pinned}, route.ReasonRolloutInProgress, 15*time.Second) // early: not due
	at(70*time.Second, []share{old(36), fresh(19), pinned}, route.ReasonRolloutInProgress, 30*time.Second)
	at(100*time.Second, []share{old(18), fresh(37), pinned}, route.ReasonRolloutInProgress, 30*time.Second)
	at(130*time.Second, []share{fresh(55), pinned}, route.ReasonReady, 0)
}
