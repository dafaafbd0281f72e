package v1alpha1_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationKnativeValidation: the generated CRD refuses what
// Knative's validation refuses, on a real kube-apiserver (the rest of the
// schema is checked in test/integration).
func TestIntegrationKnativeValidation(t *testing.T) {
	c := testenv.ControlPlane(t).Client
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pa := func(mutate func(*v1alpha1.PodAutoscalerSpec)) *v1alpha1.PodAutoscaler {
		p := &v1alpha1.PodAutoscaler{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", GenerateName: "hello-"},
			Spec: v1alpha1.PodAutoscalerSpec{
				ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "hello"},
				Service:        v1alpha1.ServiceRef{Name: "hello"},
			},
		}
		mutate(&p.Spec)
		return p
	}
	tests := []struct {
		name   string
		mutate func(*v1alpha1.PodAutoscalerSpec)
		want   string // "" means accepted
	}{
		{"scale-down delay of whole seconds", func(s *v1alpha1.PodAutoscalerSpec) { s.ScaleDownDelay = &metav1.Duration{Duration: 62 * time.Second} }, ""},
		{"scale-down delay with milliseconds", func(s *v1alpha1.PodAutoscalerSpec) {
			s.ScaleDownDelay = &metav1.Duration{Duration: 61984 * time.Millisecond}
		}, "scaleDownDelay must be whole seconds"},
		{"min-scale at activation-scale", func(s *v1alpha1.PodAutoscalerSpec) {
			s.MinScale, s.ActivationScale = ptr.To(int32(3)), ptr.To(int32(3))
		}, ""},
		{"min-scale above activation-scale", func(s *v1alpha1.PodAutoscalerSpec) {
			s.MinScale, s.ActivationScale = ptr.To(int32(4)), ptr.To(int32(3))
		},
			"minScale must not exceed activationScale"},
		{"the HPA class on cpu", func(s *v1alpha1.PodAutoscalerSpec) { s.Class = v1alpha1.ClassHPA; s.Metric = "cpu" }, ""},
		{"cpu with the class unset (the annotation may set it)", func(s *v1alpha1.PodAutoscalerSpec) { s.Metric = "memory" }, ""},
		{"the KPA on cpu", func(s *v1alpha1.PodAutoscalerSpec) { s.Class = v1alpha1.ClassKPA; s.Metric = "cpu" },
			"metric cpu and memory need class hpa.autoscaling.knative.dev"},
		{"a class of another autoscaler", func(s *v1alpha1.PodAutoscalerSpec) { s.Class = "custom.example.com" },
			`spec.class: Unsupported value: "custom.example.com"`},
		{"service name of 55 characters", func(s *v1alpha1.PodAutoscalerSpec) { s.Service.Name = strings.Repeat("a", 55) }, ""},
		{"service name of 56 characters", func(s *v1alpha1.PodAutoscalerSpec) { s.Service.Name = strings.Repeat("a", 56) },
			"spec.service.name: Too long: may not be more than 55"},
		{"an activator queue depth and no cold-start header", func(s *v1alpha1.PodAutoscalerSpec) {
			s.Activator = &v1alpha1.ActivatorSpec{ColdStartHeader: ptr.To(false), QueueDepth: ptr.To(int32(100))}
		}, ""},
		{"an activator queue depth of 0", func(s *v1alpha1.PodAutoscalerSpec) {
			s.Activator = &v1alpha1.ActivatorSpec{QueueDepth: ptr.To(int32(0))}
		},
			"spec.activator.queueDepth: Invalid value: 0: spec.activator.queueDepth in body should be greater than or equal to 1"},
		{"an activator queue depth over a million", func(s *v1alpha1.PodAutoscalerSpec) {
			s.Activator = &v1alpha1.ActivatorSpec{QueueDepth: ptr.To(int32(v1alpha1.MaxQueueDepth + 1))}
		}, "spec.activator.queueDepth: Invalid value: 1000001: spec.activator.queueDepth in body should be less than or equal to 1000000"},
		{"health checks by path and user agent", func(s *v1alpha1.PodAutoscalerSpec) {
			s.Activator = &v1alpha1.ActivatorSpec{HealthChecks: &v1alpha1.HealthChecks{Paths: []v1alpha1.HealthCheckPath{"/healthz", "/"},
				UserAgents: []v1alpha1.HealthCheckUserAgent{"ELB-HealthChecker/2.0"}, Status: ptr.To(int32(204))}}
		}, ""},
		{"health checks of every request", func(s *v1alpha1.PodAutoscalerSpec) {
			s.Activator = &v1alpha1.ActivatorSpec{HealthChecks: &v1alpha1.HealthChecks{}}
		},
			"healthChecks needs paths, userAgents or both"},
		{"a health check path with a query", func(s *v1alpha1.PodAutoscalerSpec) {
			s.Activator = &v1alpha1.ActivatorSpec{HealthChecks: &v1alpha1.HealthChecks{Paths: []v1alpha1.HealthCheckPath{"/healthz?deep=1"}}}
		}, "spec.activator.healthChecks.paths[0]: Invalid value: \"/healthz?deep=1\""},
		{"a health check path that is not absolute", func(s *v1alpha1.PodAutoscalerSpec) {
			s.Activator = &v1alpha1.ActivatorSpec{HealthChecks: &v1alpha1.HealthChecks{Paths: []v1alpha1.HealthCheckPath{"healthz"}}}
		}, "spec.activator.healthChecks.paths[0]: Invalid value: \"healthz\""},
		{"a health check status of 199", func(s *v1alpha1.PodAutoscalerSpec) {
			s.Activator = &v1alpha1.ActivatorSpec{HealthChecks: &v1alpha1.HealthChecks{UserAgents: []v1alpha1.HealthCheckUserAgent{"GoogleHC"}, Status: ptr.To(int32(199))}}
		}, "spec.activator.healthChecks.status: Invalid value: 199"},
		{"seventeen health check paths", func(s *v1alpha1.PodAutoscalerSpec) {
			var paths []v1alpha1.HealthCheckPath
			for i := range 17 {
				paths = append(paths, v1alpha1.HealthCheckPath(fmt.Sprintf("/h%d", i)))
			}
			s.Activator = &v1alpha1.ActivatorSpec{HealthChecks: &v1alpha1.HealthChecks{Paths: paths}}
		}, "spec.activator.healthChecks.paths: Too many: 17: must have at most 16 items"},
		{"a min-scale schedule", func(s *v1alpha1.PodAutoscalerSpec) {
			s.MaxScale = ptr.To(int32(5))
			s.MinScaleSchedule = &v1alpha1.MinScaleSchedule{TimeZone: "Europe/Berlin", Windows: []v1alpha1.MinScaleWindow{
				{Name: "working-hours", Days: []v1alpha1.Weekday{"Mon", "Tue", "Wed", "Thu", "Fri"}, Start: "08:00", End: "18:00", MinScale: 3},
				{Name: "nightly-batch", Start: "23:30", End: "02:00", MinScale: 5},
				{Name: "evening", Start: "18:00", End: "24:00", MinScale: 1},
			}}
		}, ""},
		{"a schedule's time zone that is no zone", func(s *v1alpha1.PodAutoscalerSpec) {
			s.MinScaleSchedule = &v1alpha1.MinScaleSchedule{TimeZone: "Mars/Olympus_Mons", Windows: []v1alpha1.MinScaleWindow{{Name: "w", Start: "08:00", End: "18:00", MinScale: 1}}}
		}, "timeZone must be an IANA time zone name such as Europe/Berlin, or UTC"},
		{"a schedule's time zone that is a local one", func(s *v1alpha1.PodAutoscalerSpec) {
			s.MinScaleSchedule = &v1alpha1.MinScaleSchedule{TimeZone: "Local", Windows: []v1alpha1.MinScaleWindow{{Name: "w", Start: "08:00", End: "18:00", MinScale: 1}}}
		}, "timeZone must be an IANA time zone name"},
		{"a window of no length", func(s *v1alpha1.PodAutoscalerSpec) {
			s.MinScaleSchedule = &v1alpha1.MinScaleSchedule{TimeZone: "UTC", Windows: []v1alpha1.MinScaleWindow{{Name: "w", Start: "08:00", End: "08:00", MinScale: 1}}}
		}, "start and end must differ"},
		{"a window at 25 o'clock", func(s *v1alpha1.PodAutoscalerSpec) {
			s.MinScaleSchedule = &v1alpha1.MinScaleSchedule{TimeZone: "UTC", Windows: []v1alpha1.MinScaleWindow{{Name: "w", Start: "25:00", End: "08:00", MinScale: 1}}}
		}, "spec.minScaleSchedule.windows[0].start: Invalid value: \"25:00\""},
		{"a window on a day that is none", func(s *v1alpha1.PodAutoscalerSpec) {
			s.MinScaleSchedule = &v1alpha1.MinScaleSchedule{TimeZone: "UTC", Windows: []v1alpha1.MinScaleWindow{{Name: "w", Days: []v1alpha1.Weekday{"Monday"}, Start: "08:00", End: "09:00", MinScale: 1}}}
		}, `spec.minScaleSchedule.windows[0].days[0]: Unsupported value: "Monday"`},
		{"a window above max-scale", func(s *v1alpha1.PodAutoscalerSpec) {
			s.MaxScale = ptr.To(int32(2))
			s.MinScaleSchedule = &v1alpha1.MinScaleSchedule{TimeZone: "UTC", Windows: []v1alpha1.MinScaleWindow{{Name: "w", Start: "08:00", End: "09:00", MinScale: 3}}}
		}, "a minScaleSchedule window's minScale must not exceed maxScale"},
		{"a schedule with the external class", func(s *v1alpha1.PodAutoscalerSpec) {
			s.Class = v1alpha1.ClassExternal
			s.MinScaleSchedule = &v1alpha1.MinScaleSchedule{TimeZone: "UTC", Windows: []v1alpha1.MinScaleWindow{{Name: "w", Start: "08:00", End: "09:00", MinScale: 1}}}
		}, "minScaleSchedule does not apply to class external.autoscaling.sockscale.dev"},
		{"two windows of one name", func(s *v1alpha1.PodAutoscalerSpec) {
			s.MinScaleSchedule = &v1alpha1.MinScaleSchedule{TimeZone: "UTC", Windows: []v1alpha1.MinScaleWindow{
				{Name: "w", Start: "08:00", End: "09:00", MinScale: 1}, {Name: "w", Start: "10:00", End: "11:00", MinScale: 1}}}
		}, "spec.minScaleSchedule.windows[1]: Duplicate value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := c.Create(ctx, pa(tt.mutate))
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("err = %v, want it to say %q", err, tt.want)
			}
		})
	}
}
