package config

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

// ForPodAutoscaler is a PodAutoscaler's effective settings: c, then the
// annotations of its Deployment's pod template, then its spec.
func ForPodAutoscaler(c *Config, pa *v1alpha1.PodAutoscaler, d *appsv1.Deployment) (Settings, error) {
	return ForTarget(c, pa, d.Spec.Template.Annotations, "Deployment "+d.Name)
}

// ForTarget is a PodAutoscaler's effective settings: c, then the
// annotations of its target's pod template (template, of the target
// named by of; nil where it is not read: a target of another kind than
// Deployment is read through its /scale, which has no pod template), then
// its spec.
func ForTarget(c *Config, pa *v1alpha1.PodAutoscaler, template map[string]string, of string) (Settings, error) {
	ann, err := ParseAnnotations(template)
	if err != nil {
		return Settings{}, fmt.Errorf("pod template of %s: %w", of, err)
	}
	return Effective(c, pa.Spec.ContainerConcurrency, ann, specOverrides(&pa.Spec))
}

// specOverrides are the settings a PodAutoscaler's spec sets.
func specOverrides(s *v1alpha1.PodAutoscalerSpec) *Overrides {
	o := &Overrides{
		MinScale: s.MinScale, MaxScale: s.MaxScale, InitialScale: s.InitialScale, ActivationScale: s.ActivationScale,
		Target: s.Target, TargetUtilizationPercentage: s.TargetUtilizationPercentage, TargetBurstCapacity: s.TargetBurstCapacity,
		PanicWindowPercentage: s.PanicWindowPercentage, PanicThresholdPercentage: s.PanicThresholdPercentage,
	}
	if s.Class != "" {
		o.Class = (*string)(&s.Class)
	}
	if s.Metric != "" {
		o.Metric = &s.Metric
	}
	if s.MetricAggregationAlgorithm != "" {
		o.Aggregation = &s.MetricAggregationAlgorithm
	}
	if s.ScaleDownDelay != nil {
		o.ScaleDownDelay = &s.ScaleDownDelay.Duration
	}
	if s.Window != nil {
		o.Window = &s.Window.Duration
	}
	if s.ScaleToZeroPodRetentionPeriod != nil {
		o.ScaleToZeroPodRetentionPeriod = &s.ScaleToZeroPodRetentionPeriod.Duration
	}
	return o
}
