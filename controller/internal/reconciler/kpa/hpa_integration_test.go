package kpa_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/kpa"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationHPAClass: a PodAutoscaler of the HPA class makes and
// keeps a HorizontalPodAutoscaler that owns the counts from 1 up (the test
// plays the HPA controller, which envtest does not run), while sockscale
// takes the target to zero when idle, through the activator, and back to
// its activation scale on the activator's report.
func TestIntegrationHPAClass(t *testing.T) {
	cl := testenv.ControlPlane(t)
	createActivators(t, cl.Client, 3)
	ctx, c := context.Background(), cl.Client

	t.Run("HPA owns 1..N, sockscale owns zero", func(t *testing.T) {
		r := newRig(t, cl, "hpa", func(s *v1alpha1.PodAutoscalerSpec) {
			s.Class = v1alpha1.ClassHPA
			s.Metric = "concurrency"
			s.Target = ptr.To(10.0)
			s.ActivationScale = ptr.To(int32(3))
			s.Window = &metav1.Duration{Duration: 10 * time.Second}
		})
		// target 10 x 70 % = 7 per pod, from 1 to unlimited, scaling down
		// over the stable window.
		want := autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "hpa"},
			MinReplicas:    ptr.To(int32(1)),
			MaxReplicas:    math.MaxInt32,
			Metrics: []autoscalingv2.MetricSpec{{Type: autoscalingv2.PodsMetricSourceType, Pods: &autoscalingv2.PodsMetricSource{
				Metric: autoscalingv2.MetricIdentifier{Name: "concurrency"},
				Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: ptr.To(resource.MustParse("7"))},
			}}},
		}
		hpa := getHPA(t, c, "hpa")
		if diff := cmp.Diff(want, hpa.Spec, cmpopts.IgnoreFields(autoscalingv2.HorizontalPodAutoscalerSpec{}, "Behavior"), cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })); diff != "" {
			t.Errorf("HPA spec (-want +got):\n%s", diff)
		}
		if b := hpa.Spec.Behavior; b == nil || b.ScaleDown == nil || ptr.Deref(b.ScaleDown.StabilizationWindowSeconds, 0) != 10 {
			t.Errorf("HPA behavior %+v, want a scale-down stabilization of the 10 s stable window", b)
		}
		if !metav1.IsControlledBy(hpa, r.pa()) || hpa.Labels[kpa.LabelPodAutoscaler] != "hpa" {
			t.Errorf("HPA owners %v labels %v, want controlled by the PodAutoscaler and labelled", hpa.OwnerReferences, hpa.Labels)
		}
		assertCondition(t, c, "hpa", kpa.ConditionHPA, "Pending")

		// 28 in flight would be 4 pods for the KPA; sockscale leaves the
		// count to the HPA, which (played here) sets 4.
		r.offered = 28
		r.run(20 * time.Second)
		if got := r.replicas(); got != 1 {
			t.Fatalf("under load the HPA class's Deployment went to %d pods by sockscale's hand, want the HPA's 1", got)
		}
		scaleTo(t, c, r, 4)
		r.run(20 * time.Second)
		if got := r.replicas(); got != 4 {
			t.Fatalf("the HPA's 4 pods became %d", got)
		}
		// No burst capacity to keep: the pods take traffic directly.
		r.expectPublic(v1alpha1.ModeServe, 4)
		if pa := r.pa(); pa.Status.Panicking || ptr.Deref(pa.Status.DesiredScale, -1) != 4 {
			t.Errorf("status panicking %v desired %v, want no panic and 4", pa.Status.Panicking, pa.Status.DesiredScale)
		}

		// Someone edits the HPA: corrected on the next tick.
		hpa = getHPA(t, c, "hpa")
		hpa.Spec.MaxReplicas = 2
		if err := c.Update(ctx, hpa); err != nil {
			t.Fatal(err)
		}
		r.tick()
		if got := getHPA(t, c, "hpa").Spec.MaxReplicas; got != math.MaxInt32 {
			t.Errorf("an edited HPA keeps maxReplicas %d, want it put back to %d", got, int32(math.MaxInt32))
		}

		// Idle: the 4 pods stay (not 1, as the KPA would keep) through
		// the stable window and the grace period, then go together once
		// an activator answers on the public Service.
		r.offered = 0
		r.prober.inPath = true
		idle := r.clk.Now()
		for r.clk.Now().Sub(idle) < 36*time.Second {
			r.tick()
			if got := r.replicas(); got != 4 {
				t.Fatalf("%s idle: %d pods, want the HPA's 4 until the grace period ends", r.clk.Now().Sub(idle), got)
			}
		}
		r.run(20 * time.Second)
		if got := r.replicas(); got != 0 {
			t.Fatalf("%s idle: %d pods, want 0; status %+v", r.clk.Now().Sub(idle), got, r.pa().Status)
		}
		r.expectPublic(v1alpha1.ModeProxy, 2)
		assertCondition(t, c, "hpa", kpa.ConditionActive, kpa.ReasonNoTraffic)

		// A request at the activator: the activation scale at once.
		r.activatorLoad = 1
		r.run(2 * time.Second)
		if got := r.replicas(); got != 3 {
			t.Fatalf("after the activator's report: %d pods, want the activation scale 3", got)
		}

		// Back to the KPA: its HPA goes.
		pa := r.pa()
		pa.Spec.Class = v1alpha1.ClassKPA
		if err := c.Update(ctx, pa); err != nil {
			t.Fatal(err)
		}
		r.tick()
		if err := getHPAErr(c, "hpa"); !apierrors.IsNotFound(err) {
			t.Errorf("after the switch to the KPA the HPA is still there (get: %v)", err)
		}
		if meta.FindStatusCondition(r.pa().Status.Conditions, kpa.ConditionHPA) != nil {
			t.Errorf("the KPA's status still shows %s", kpa.ConditionHPA)
		}
	})

	t.Run("the external class: never scaled, the activator in front at zero", func(t *testing.T) {
		r := newRig(t, cl, "external", func(s *v1alpha1.PodAutoscalerSpec) {
			s.Class = v1alpha1.ClassExternal
			s.Window = &metav1.Duration{Duration: 6 * time.Second}
		})
		r.offered = 140 // the KPA's 2 pods
		r.run(20 * time.Second)
		r.offered = 0
		r.prober.inPath = true
		r.run(60 * time.Second) // the KPA would be at zero
		if got := r.replicas(); got != 1 {
			t.Fatalf("sockscale scaled a target of the external class to %d pods, want its own 1", got)
		}
		r.expectPublic(v1alpha1.ModeServe, 1)
		// Its autoscaler takes it to zero: the activators go in front, and
		// requests they hold do not scale it (its autoscaler sees them).
		scaleTo(t, c, r, 0)
		r.run(4 * time.Second) // the pods go, then the status shows it
		r.expectPublic(v1alpha1.ModeProxy, 2)
		assertCondition(t, c, "external", kpa.ConditionActive, kpa.ReasonNoTraffic)
		r.activatorLoad = 2
		r.run(10 * time.Second)
		if got := r.replicas(); got != 0 {
			t.Fatalf("held requests scaled a target of the external class to %d pods", got)
		}
		scaleTo(t, c, r, 2)
		r.run(4 * time.Second)
		r.expectPublic(v1alpha1.ModeServe, 2)
		if err := getHPAErr(c, "external"); !apierrors.IsNotFound(err) {
			t.Errorf("the external class made an HPA (get: %v)", err)
		}
	})

	t.Run("a cache that has not seen the HPA yet", func(t *testing.T) {
		// The controller's cache holds only labelled HPAs and learns of a
		// new one a moment after its create: a tick in between finds none,
		// and its create meets AlreadyExists. The API server says whose
		// it is: this PodAutoscaler's, so nothing is wrong.
		r := newRig(t, cl, "lagging", func(s *v1alpha1.PodAutoscalerSpec) { s.Class = v1alpha1.ClassHPA; s.Metric = "concurrency" })
		r.paRec.Client, r.paRec.APIReader = blindToHPAs{c}, c
		r.tick()
		if cond := meta.FindStatusCondition(r.pa().Status.Conditions, names.ConditionReady); cond == nil || cond.Status != metav1.ConditionTrue {
			t.Errorf("Ready %+v, want True (the HPA is this PodAutoscaler's)", cond)
		}
		// Through the same path, a user's HPA is still not taken over.
		theirs := &autoscalingv2.HorizontalPodAutoscaler{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "theirs-unseen"},
			Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
				ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "theirs-unseen"},
				MinReplicas:    ptr.To(int32(2)), MaxReplicas: 5,
			},
		}
		if err := c.Create(ctx, theirs); err != nil {
			t.Fatal(err)
		}
		u := newRig(t, cl, "theirs-unseen", func(s *v1alpha1.PodAutoscalerSpec) { s.Class = v1alpha1.ClassHPA; s.Metric = "rps" })
		u.paRec.Client, u.paRec.APIReader = blindToHPAs{c}, c
		u.tick()
		assertCondition(t, c, "theirs-unseen", names.ConditionReady, names.ReasonNotOwned)
		if got := getHPA(t, c, "theirs-unseen"); got.Spec.MaxReplicas != 5 || len(got.OwnerReferences) != 0 {
			t.Errorf("the user's HPA was changed: %+v", got.Spec)
		}
	})

	t.Run("a user's HPA of the same name is never taken over", func(t *testing.T) {
		theirs := &autoscalingv2.HorizontalPodAutoscaler{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "theirs"},
			Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
				ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "theirs"},
				MinReplicas:    ptr.To(int32(2)), MaxReplicas: 5,
			},
		}
		if err := c.Create(ctx, theirs); err != nil {
			t.Fatal(err)
		}
		newRig(t, cl, "theirs", func(s *v1alpha1.PodAutoscalerSpec) { s.Class = v1alpha1.ClassHPA; s.Metric = "rps" })
		assertCondition(t, c, "theirs", names.ConditionReady, names.ReasonNotOwned)
		got := getHPA(t, c, "theirs")
		if got.Spec.MaxReplicas != 5 || len(got.Spec.Metrics) != 1 || got.Spec.Metrics[0].Type != autoscalingv2.ResourceMetricSourceType || len(got.OwnerReferences) != 0 {
			t.Errorf("the user's HPA was changed: %+v", got)
		}
	})
}

// blindToHPAs is a client whose reads never find an HPA, as the
// controller's cache before it sees one (or one without the label).
type blindToHPAs struct{ client.Client }

func (b blindToHPAs) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*autoscalingv2.HorizontalPodAutoscaler); ok {
		return apierrors.NewNotFound(schema.GroupResource{Group: "autoscaling", Resource: "horizontalpodautoscalers"}, key.Name)
	}
	return b.Client.Get(ctx, key, obj, opts...)
}

func getHPAErr(c client.Client, name string) error {
	return c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name}, &autoscalingv2.HorizontalPodAutoscaler{})
}

func getHPA(t *testing.T, c client.Client, name string) *autoscalingv2.HorizontalPodAutoscaler {
	t.Helper()
	var hpa autoscalingv2.HorizontalPodAutoscaler
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name}, &hpa); err != nil {
		t.Fatalf("get HPA %s: %v", name, err)
	}
	return &hpa
}

// scaleTo plays the HPA controller: it sets the Deployment's replicas
// through /scale.
func scaleTo(t *testing.T, c client.Client, r *rig, n int32) {
	t.Helper()
	d := r.deployment()
	sc := &autoscalingv1.Scale{}
	if err := c.SubResource("scale").Get(context.Background(), d, sc); err != nil {
		t.Fatal(err)
	}
	sc.Spec.Replicas = n
	if err := c.SubResource("scale").Update(context.Background(), d, client.WithSubResourceBody(sc)); err != nil {
		t.Fatal(err)
	}
}
