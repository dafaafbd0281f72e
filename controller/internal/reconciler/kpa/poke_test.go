package kpa

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
)

// TestPokeWakesOnlyTargetsAtZero: load for a target whose last decision
// was 0 pods queues it at once; a target with pods, or not decided yet,
// waits for its tick.
func TestPokeWakesOnlyTargetsAtZero(t *testing.T) {
	r := newPokeTest(t)
	r.track("idle-pa", "idle", 0)
	r.track("busy-pa", "busy", 3)
	r.track("fresh-pa", "fresh", -1)
	r.Poke([]collector.Key{{Namespace: "default", Name: "idle"}, {Namespace: "default", Name: "busy"}, {Namespace: "default", Name: "fresh"}})
	if diff := cmp.Diff([]string{"default/idle-pa"}, r.poked()); diff != "" {
		t.Errorf("pokes (-want +got):\n%s (the PodAutoscaler, not the Deployment)", diff)
	}
}

// TestPokeFollowsTheIndex: the index Poke reads follows a PodAutoscaler
// that moves to another Deployment and one that is deleted, and wakes
// every PodAutoscaler of a shared Deployment.
func TestPokeFollowsTheIndex(t *testing.T) {
	r := newPokeTest(t)
	r.track("a", "web", 0)
	r.track("b", "web", 0)
	r.track("c", "api", 0)
	r.Poke([]collector.Key{{Namespace: "default", Name: "web"}})
	if diff := cmp.Diff([]string{"default/a", "default/b"}, r.poked()); diff != "" {
		t.Errorf("both PodAutoscalers of web (-want +got):\n%s", diff)
	}

	r.track("a", "api", 0) // a now scales api
	r.forget(collector.Key{Namespace: "default", Name: "c"})
	r.Poke([]collector.Key{{Namespace: "default", Name: "web"}})
	if diff := cmp.Diff([]string{"default/b"}, r.poked()); diff != "" {
		t.Errorf("after a moved (-want +got):\n%s", diff)
	}
	r.Poke([]collector.Key{{Namespace: "default", Name: "api"}})
	if diff := cmp.Diff([]string{"default/a"}, r.poked()); diff != "" {
		t.Errorf("after c was deleted (-want +got):\n%s", diff)
	}

	r.forget(collector.Key{Namespace: "default", Name: "a"})
	r.forget(collector.Key{Namespace: "default", Name: "b"})
	if idx := r.zeroIndex.Load(); len(r.atZero) != 0 || len(*idx) != 0 {
		t.Errorf("index keeps %v (Poke's copy %v) after every PodAutoscaler was deleted", r.atZero, *idx)
	}
}

// TestPokeFollowsDecisions: a target leaves the index when a decision
// gives it pods and comes back when one takes them all, and a batch that
// names it many times wakes it once.
func TestPokeFollowsDecisions(t *testing.T) {
	r := newPokeTest(t)
	web := collector.Key{Namespace: "default", Name: "web"}
	r.track("a", "web", 0)
	r.setLastDesired(collector.Key{Namespace: "default", Name: "a"}, 2)
	r.Poke([]collector.Key{web})
	if got := r.poked(); len(got) != 0 || len(*r.zeroIndex.Load()) != 0 {
		t.Errorf("a target decided at 2 pods was poked (%v) or still in Poke's index (%v)", got, *r.zeroIndex.Load())
	}
	r.setLastDesired(collector.Key{Namespace: "default", Name: "a"}, 0)
	r.Poke([]collector.Key{web, web, web})
	if diff := cmp.Diff([]string{"default/a"}, r.poked()); diff != "" {
		t.Errorf("back at zero (-want +got):\n%s", diff)
	}
}

type pokeTest struct {
	*PodAutoscaler
	t *testing.T
	s config.Settings
}

func newPokeTest(t *testing.T) pokeTest {
	s, err := config.Effective(config.Defaults(), 0, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return pokeTest{PodAutoscaler: &PodAutoscaler{Collector: collector.New(clock.RealClock{})}, t: t, s: s}
}

// track makes PodAutoscaler pa (in default) scale Deployment deploy, as
// its tick does, with desired as its last decision.
func (p pokeTest) track(pa, deploy string, desired int32) {
	key := collector.Key{Namespace: "default", Name: pa}
	p.decider(key, collector.Key{Namespace: "default", Name: deploy}, p.s, 0, time.Unix(0, 0))
	p.setLastDesired(key, desired)
}

// poked drains the queued pokes, sorted.
func (p pokeTest) poked() []string {
	var got []string
	for ch := p.pokeChannel(); len(ch) > 0; {
		ev := <-ch
		got = append(got, ev.Object.GetNamespace()+"/"+ev.Object.GetName())
	}
	slices.Sort(got)
	return got
}

// TestPokeGoesBeforeDueTicks: in the controller's priority queue a poked
// PodAutoscaler is handed out before ticks that were due earlier (the
// requeue at tickPriority is checked by the scenarios' rig).
func TestPokeGoesBeforeDueTicks(t *testing.T) {
	q := priorityqueue.New[reconcile.Request]("poke-test")
	defer q.ShutDown()
	for i := range 5 {
		q.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(tickPriority)}, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: fmt.Sprintf("tick-%d", i)}})
	}
	q.AddWithOpts(priorityqueue.AddOpts{Priority: ptr.To(handler.LowPriority)}, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "listed-at-start"}})
	pokeHandler.Generic(context.Background(), event.GenericEvent{Object: &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "poked"}}}, q)
	got, priority, _ := q.GetWithPriority()
	if got.Name != "poked" || priority != pokePriority {
		t.Errorf("first out: %s at priority %d, want poked at %d (5 ticks were due before it)", got.Name, priority, pokePriority)
	}
	q.Done(got)
	var order []string
	for range 6 {
		r, _, _ := q.GetWithPriority()
		order = append(order, r.Name)
		q.Done(r)
	}
	if order[5] != "listed-at-start" {
		t.Errorf("order %v: the LowPriority item should come last", order)
	}
}

// TestAPokeThatCannotBeDecidedIsNotTimed: a poked PodAutoscaler whose
// Deployment is missing cannot be decided; when the Deployment comes, the
// decision it gets is no poke's, and the poke duration observes nothing
// (before, it observed the whole wait for the Deployment).
func TestAPokeThatCannotBeDecidedIsNotTimed(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	pa := &v1alpha1.PodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-web"},
		Spec: v1alpha1.PodAutoscalerSpec{
			ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "web"},
			Service:        v1alpha1.ServiceRef{Name: "web"},
		},
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&v1alpha1.PodAutoscaler{}).WithObjects(pa).Build()
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	reg := prometheus.NewRegistry()
	r := &PodAutoscaler{Client: c, Collector: collector.New(clk), Clock: clk, Config: config.Defaults, Metrics: NewMetrics(reg)}
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "web"}}
	key := collector.Key{Namespace: "default", Name: "web"}

	r.pokedAt.Store(key, time.Now().Add(-time.Minute)) // as Poke stores it
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	one := int32(1)
	if err := c.Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec:       appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
		Status:     appsv1.DeploymentStatus{ReadyReplicas: 1},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if n := histogramCount(t, reg, "sockscale_controller_decision_duration_seconds"); n != 1 {
		t.Fatalf("%d decisions recorded, want 1 (the test needs a full decision)", n)
	}
	if n := histogramCount(t, reg, "sockscale_controller_poke_duration_seconds"); n != 0 {
		t.Errorf("the poke duration observed %d pokes, want 0: the decision after the Deployment came was no poke's", n)
	}
}

// histogramCount is how many observations reg's histogram name holds.
func histogramCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatal("no " + name)
	return 0
}
