package config

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

// TestForPodAutoscalerMetric: the pod template's metric annotation applies
// when the spec has none, and the spec's wins when it has one.
func TestForPodAutoscalerMetric(t *testing.T) {
	d := &appsv1.Deployment{}
	d.Name = "hello"
	d.Spec.Template.Annotations = map[string]string{"autoscaling.knative.dev/metric": "rps"}
	for _, tt := range []struct{ spec, want string }{
		{"", MetricRPS},
		{MetricConcurrency, MetricConcurrency},
	} {
		pa := &v1alpha1.PodAutoscaler{Spec: v1alpha1.PodAutoscalerSpec{Metric: tt.spec}}
		s, err := ForPodAutoscaler(Defaults(), pa, d)
		if err != nil {
			t.Fatal(err)
		}
		if s.Metric != tt.want {
			t.Errorf("spec.metric %q, annotation rps: metric %q, want %q", tt.spec, s.Metric, tt.want)
		}
	}
	s, err := ForPodAutoscaler(Defaults(), &v1alpha1.PodAutoscaler{}, &appsv1.Deployment{})
	if err != nil || s.Metric != MetricConcurrency {
		t.Errorf("neither set: metric %q, %v; want %q", s.Metric, err, MetricConcurrency)
	}
}
