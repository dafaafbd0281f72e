package kpa

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/config"
	"github.com/sockscale/sockscale/controller/internal/decider"
)

// TestMakeHPAMetrics: each metric becomes the HPA metric Knative's HPA
// class would write, at the settings' HPA target; min-scale 0 is an HPA
// minimum of 1, max-scale 0 no maximum.
func TestMakeHPAMetrics(t *testing.T) {
	pa := &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart"},
		Spec: v1alpha1.PodAutoscalerSpec{ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "cart-deployment"}}}
	q := func(s string) *resource.Quantity { return ptr.To(resource.MustParse(s)) }
	tests := []struct {
		name     string
		spec     config.Overrides
		min, max int32
		want     autoscalingv2.MetricSpec
	}{
		{"concurrency 10 at 70%", config.Overrides{Metric: ptr.To("concurrency"), Target: ptr.To(10.0)}, 1, math.MaxInt32,
			autoscalingv2.MetricSpec{Type: autoscalingv2.PodsMetricSourceType, Pods: &autoscalingv2.PodsMetricSource{
				Metric: autoscalingv2.MetricIdentifier{Name: "concurrency"}, Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: q("7")}}}},
		{"rps 1.5 at 70%: a thousandth's precision", config.Overrides{Metric: ptr.To("rps"), Target: ptr.To(1.5), MinScale: ptr.To(int32(2)), MaxScale: ptr.To(int32(9))}, 2, 9,
			autoscalingv2.MetricSpec{Type: autoscalingv2.PodsMetricSourceType, Pods: &autoscalingv2.PodsMetricSource{
				Metric: autoscalingv2.MetricIdentifier{Name: "rps"}, Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: q("1050m")}}}},
		{"cpu unset: 80 % of the requests", config.Overrides{}, 1, math.MaxInt32,
			autoscalingv2.MetricSpec{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{
				Name: corev1.ResourceCPU, Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To(int32(80))}}}},
		{"memory 256 MiB", config.Overrides{Metric: ptr.To("memory"), Target: ptr.To(256.0)}, 1, math.MaxInt32,
			autoscalingv2.MetricSpec{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{
				Name: corev1.ResourceMemory, Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: q("256Mi")}}}},
	}
	for _, tt := range tests {
		spec := tt.spec
		spec.Class = ptr.To(config.ClassHPA)
		s, err := config.Effective(config.Defaults(), 0, nil, &spec)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		hpa := makeHPA(pa, s)
		if diff := cmp.Diff([]autoscalingv2.MetricSpec{tt.want}, hpa.Spec.Metrics, cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })); diff != "" {
			t.Errorf("%s: metrics (-want +got):\n%s", tt.name, diff)
		}
		if *hpa.Spec.MinReplicas != tt.min || hpa.Spec.MaxReplicas != tt.max || hpa.Spec.ScaleTargetRef.Name != "cart-deployment" || hpa.Name != "cart" || hpa.Namespace != "shop" {
			t.Errorf("%s: %s/%s scales %s from %d to %d, want shop/cart scaling cart-deployment from %d to %d", tt.name, hpa.Namespace, hpa.Name,
				hpa.Spec.ScaleTargetRef.Name, *hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas, tt.min, tt.max)
		}
		if got := *hpa.Spec.Behavior.ScaleDown.StabilizationWindowSeconds; got != 60 {
			t.Errorf("%s: scale-down stabilization %d s, want the stable window's 60", tt.name, got)
		}
	}
}

// TestHPAWish: sockscale keeps the HPA's count except at zero.
func TestHPAWish(t *testing.T) {
	s, err := config.Effective(config.Defaults(), 0, nil, &config.Overrides{Class: ptr.To(config.ClassHPA), Window: ptr.To(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	withMin := s
	withMin.MinScale = 2
	noZero := s
	noZero.EnableScaleToZero = false
	tests := []struct {
		name    string
		s       config.Settings
		dec     decider.Decision
		idle    bool
		current int32
		want    int32
	}{
		{"loaded: the HPA's count", s, decider.Decision{Valid: true, DesiredScale: 20}, false, 4, 4},
		{"the decider stepping down: still the HPA's", s, decider.Decision{Valid: true, DesiredScale: 2}, false, 4, 4},
		{"idle: zero", s, decider.Decision{Valid: true, DesiredScale: 2}, true, 4, 0},
		{"idle with min-scale 2: the HPA's", withMin, decider.Decision{Valid: true}, true, 4, 4},
		{"idle without scale to zero: the HPA's", noZero, decider.Decision{Valid: true}, true, 4, 4},
		{"no data: the HPA's", s, decider.Decision{DesiredScale: -1}, true, 4, 4},
		{"at zero, load: the decider's count (the activation scale, raised there)", s, decider.Decision{Valid: true, DesiredScale: 3}, false, 0, 3},
		{"at zero, load for 5: 5", s, decider.Decision{Valid: true, DesiredScale: 5}, false, 0, 5},
		{"at zero, load for 5 with max-scale 4: 4", func() config.Settings { c := s; c.MaxScale = 4; return c }(), decider.Decision{Valid: true, DesiredScale: 5}, false, 0, 4},
		{"at zero, none: 0", s, decider.Decision{Valid: true}, true, 0, 0},
		{"at zero with min-scale 2: 2", withMin, decider.Decision{Valid: true}, true, 0, 2},
	}
	for _, tt := range tests {
		if got := hpaWish(tt.dec, tt.idle, tt.s, tt.current, true, true); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
}
