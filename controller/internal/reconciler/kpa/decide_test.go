package kpa

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/bucket"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/reconciler/collect"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
)

// ownerRig is one PodAutoscaler "web" of Deployment "app" (1 ready pod),
// with both reconcilers on one collector, as on every replica.
type ownerRig struct {
	c   client.Client
	col *collector.Collector
	pa  *PodAutoscaler
	cr  *collect.Reconciler
	req ctrl.Request
}

func newOwnerRig(t *testing.T) *ownerRig {
	t.Helper()
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	one := int32(1)
	c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&v1alpha1.PodAutoscaler{}).WithObjects(
		&appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "app"},
			Spec:       appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "app"}}},
			Status:     appsv1.DeploymentStatus{ReadyReplicas: 1},
		},
		&v1alpha1.PodAutoscaler{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-web"},
			Spec: v1alpha1.PodAutoscalerSpec{
				ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "app"},
				Service:        v1alpha1.ServiceRef{Name: "web"},
			},
		}).Build()
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	col := collector.New(clk)
	return &ownerRig{
		c: c, col: col,
		pa:  &PodAutoscaler{Client: c, Collector: col, Clock: clk, Config: config.Defaults, Metrics: NewMetrics(prometheus.NewRegistry())},
		cr:  &collect.Reconciler{Client: c, Collector: col, Config: config.Defaults},
		req: ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "web"}},
	}
}

func (o *ownerRig) reconcile(t *testing.T, r interface {
	Reconcile(context.Context, ctrl.Request) (ctrl.Result, error)
}) {
	t.Helper()
	if _, err := r.Reconcile(context.Background(), o.req); err != nil {
		t.Fatal(err)
	}
}

// TestBucketMoveKeepsTheWindows: when the bucket of a target moves to
// another replica, the PodAutoscaler reconciler drops its own state but
// not the collector's registration, which the collect reconciler owns:
// the windows stay warm for a bucket won back or a failover. (With two
// owners, its forget dropped the windows until collect's next resync.)
func TestBucketMoveKeepsTheWindows(t *testing.T) {
	o := newOwnerRig(t)
	app := collector.Key{Namespace: "default", Name: "app"}
	o.reconcile(t, o.cr)
	o.reconcile(t, o.pa) // no buckets: owns every target, decides it
	if o.col.Len() != 1 || o.pa.state(collector.Key{Namespace: "default", Name: "web"}) == nil {
		t.Fatalf("collector keeps %d targets, decider state %v; want 1 and some", o.col.Len(), o.pa.state(collector.Key{Namespace: "default", Name: "web"}))
	}

	// The bucket goes: a Set whose elections never ran holds none.
	set, err := bucket.New(bucket.Options{Count: 2, Namespace: "ns", Identity: "me", Leases: kubefake.NewClientset().CoordinationV1(), Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	o.pa.Buckets = set
	o.reconcile(t, o.pa)
	if st := o.pa.state(collector.Key{Namespace: "default", Name: "web"}); st != nil {
		t.Errorf("the decider's state outlived its bucket")
	}
	if o.col.Len() != 1 {
		t.Fatalf("after the bucket moved the collector keeps %d targets, want 1: collect's registration stays", o.col.Len())
	}
	if _, err := o.col.Values(app, time.Unix(1_700_000_000, 0)); err != nil {
		t.Errorf("windows of %s after the bucket moved: %v", app, err)
	}

	// Only the collect reconciler forgets, when the PodAutoscaler goes.
	if err := o.c.Delete(context.Background(), &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"}}); err != nil {
		t.Fatal(err)
	}
	o.reconcile(t, o.cr)
	if o.col.Len() != 0 {
		t.Errorf("after the PodAutoscaler went the collector keeps %d targets, want 0", o.col.Len())
	}
}

// TestNotWatchedYetIsNoData: a PodAutoscaler decided before the collect
// reconciler registered its target neither registers it (the collector
// keeps nothing) nor fails: it has no data, and the scale holds.
func TestNotWatchedYetIsNoData(t *testing.T) {
	o := newOwnerRig(t)
	o.reconcile(t, o.pa)
	if o.col.Len() != 0 {
		t.Errorf("the PodAutoscaler reconciler registered %d targets, want 0: collect alone does", o.col.Len())
	}
	var pa v1alpha1.PodAutoscaler
	if err := o.c.Get(context.Background(), o.req.NamespacedName, &pa); err != nil {
		t.Fatal(err)
	}
	if cond := meta.FindStatusCondition(pa.Status.Conditions, names.ConditionReady); cond == nil || cond.Reason != "NoData" {
		t.Errorf("Ready = %+v, want reason NoData", cond)
	}
	var d appsv1.Deployment
	if err := o.c.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: "app"}, &d); err != nil {
		t.Fatal(err)
	}
	if *d.Spec.Replicas != 1 {
		t.Errorf("without data the Deployment went to %d replicas, want 1", *d.Spec.Replicas)
	}
}
