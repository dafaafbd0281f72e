package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationAPIValidation installs the generated CRDs in a real
// kube-apiserver and checks that bad PodAutoscalers are refused with a
// message naming the field and what is allowed.
func TestIntegrationAPIValidation(t *testing.T) {
	c := testenv.ControlPlane(t).Client
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	valid := func() *v1alpha1.PodAutoscaler {
		return &v1alpha1.PodAutoscaler{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", GenerateName: "hello-"},
			Spec: v1alpha1.PodAutoscalerSpec{
				ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "hello"},
				Service:        v1alpha1.ServiceRef{Name: "hello", Port: 80},
			},
		}
	}
	good := valid()
	good.Spec.MinScale, good.Spec.MaxScale = ptr.To(int32(1)), ptr.To(int32(5))
	good.Spec.Window = &metav1.Duration{Duration: 30 * time.Second}
	good.Spec.TargetBurstCapacity = ptr.To(-1.0)
	good.Spec.TimeoutSeconds = ptr.To(int32(600))
	if err := c.Create(ctx, good); err != nil {
		t.Fatalf("a valid PodAutoscaler was refused: %v", err)
	}
	// Not defaulted: an unset metric leaves the choice to the target's
	// autoscaling.knative.dev/metric annotation, else concurrency.
	if good.Spec.Metric != "" {
		t.Errorf("metric defaulted to %q, want it left unset", good.Spec.Metric)
	}

	tests := []struct {
		name   string
		mutate func(*v1alpha1.PodAutoscaler)
		want   []string
	}{
		{"min above max", func(p *v1alpha1.PodAutoscaler) { p.Spec.MinScale, p.Spec.MaxScale = ptr.To(int32(5)), ptr.To(int32(3)) },
			[]string{"minScale must not exceed maxScale"}},
		{"activation above max", func(p *v1alpha1.PodAutoscaler) {
			p.Spec.ActivationScale, p.Spec.MaxScale = ptr.To(int32(5)), ptr.To(int32(3))
		}, []string{"activationScale must not exceed maxScale"}},
		{"activation below 2", func(p *v1alpha1.PodAutoscaler) { p.Spec.ActivationScale = ptr.To(int32(1)) },
			[]string{"spec.activationScale", "should be greater than or equal to 2"}},
		{"window too short", func(p *v1alpha1.PodAutoscaler) { p.Spec.Window = &metav1.Duration{Duration: 5 * time.Second} },
			[]string{"spec.window", "window must be whole seconds from 6s to 1h"}},
		{"window not whole seconds", func(p *v1alpha1.PodAutoscaler) { p.Spec.Window = &metav1.Duration{Duration: 6500 * time.Millisecond} },
			[]string{"window must be whole seconds from 6s to 1h"}},
		{"burst capacity -2", func(p *v1alpha1.PodAutoscaler) { p.Spec.TargetBurstCapacity = ptr.To(-2.0) },
			[]string{"spec.targetBurstCapacity", "must be -1 (activator always in the path), 0, or positive"}},
		{"unknown metric", func(p *v1alpha1.PodAutoscaler) { p.Spec.Metric = "gpu" },
			[]string{"spec.metric", `Unsupported value: "gpu"`, `"concurrency", "rps", "cpu", "memory"`}},
		{"cpu with the KPA", func(p *v1alpha1.PodAutoscaler) { p.Spec.Class, p.Spec.Metric = v1alpha1.ClassKPA, "cpu" },
			[]string{"metric cpu and memory need class hpa.autoscaling.knative.dev"}},
		{"panic threshold 50", func(p *v1alpha1.PodAutoscaler) { p.Spec.PanicThresholdPercentage = ptr.To(50.0) },
			[]string{"spec.panicThresholdPercentage", "should be greater than or equal to 110"}},
		{"utilization 150", func(p *v1alpha1.PodAutoscaler) { p.Spec.TargetUtilizationPercentage = ptr.To(150.0) },
			[]string{"spec.targetUtilizationPercentage", "should be less than or equal to 100"}},
		{"target 0", func(p *v1alpha1.PodAutoscaler) { p.Spec.Target = ptr.To(0.0) },
			[]string{"spec.target", "target must be at least 0.01"}},
		{"scale down delay 2h", func(p *v1alpha1.PodAutoscaler) { p.Spec.ScaleDownDelay = &metav1.Duration{Duration: 2 * time.Hour} },
			[]string{"scaleDownDelay must be from 0s to 1h"}},
		{"timeout 601", func(p *v1alpha1.PodAutoscaler) { p.Spec.TimeoutSeconds = ptr.To(int32(601)) },
			[]string{"spec.timeoutSeconds", "should be less than or equal to 600"}},
		{"timeout 0", func(p *v1alpha1.PodAutoscaler) { p.Spec.TimeoutSeconds = ptr.To(int32(0)) },
			[]string{"spec.timeoutSeconds", "should be greater than or equal to 1"}},
		{"no target name", func(p *v1alpha1.PodAutoscaler) { p.Spec.ScaleTargetRef.Name = "" },
			[]string{"spec.scaleTargetRef.name"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pa := valid()
			tt.mutate(pa)
			err := c.Create(ctx, pa)
			if err == nil {
				t.Fatalf("the API server accepted it: %+v", pa.Spec)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
