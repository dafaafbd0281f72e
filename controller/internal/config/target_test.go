package config

import (
	"math"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"
)

func TestEffectiveTargetValue(t *testing.T) {
	c := Defaults()
	tests := []struct {
		name      string
		cc        int32
		spec      *Overrides
		total     float64
		wantValue float64
	}{
		{"defaults: 100 * 70% = 70", 0, nil, 100, 70},
		{"containerConcurrency 10: 10 * 70% = 7", 10, nil, 10, 7},
		{"target 50 under CC 10: min(50, 10) * 70% = 7", 10, &Overrides{Target: ptr.To(50.0)}, 10, 7},
		{"target 5 under CC 10: 5 * 70% = 3.5", 10, &Overrides{Target: ptr.To(5.0)}, 5, 3.5},
		{"rps default: 200 * 70% = 140", 0, &Overrides{Metric: ptr.To(MetricRPS)}, 200, 140},
		{"rps target 10 at 50%: 5", 0, &Overrides{Metric: ptr.To(MetricRPS), Target: ptr.To(10.0), TargetUtilizationPercentage: ptr.To(50.0)}, 10, 5},
		{"never below 0.01", 0, &Overrides{Target: ptr.To(0.01), TargetUtilizationPercentage: ptr.To(1.0)}, 0.01, 0.01},
	}
	for _, tt := range tests {
		s, err := Effective(c, tt.cc, nil, tt.spec)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if s.Total != tt.total || abs(s.TargetValue-tt.wantValue) > 1e-9 {
			t.Errorf("%s: total %v value %v, want %v and %v", tt.name, s.Total, s.TargetValue, tt.total, tt.wantValue)
		}
	}
}

// TestHPAClass: the HPA's target per pod is what the KPA would aim at for
// concurrency and rps, the target as given for cpu (a percentage, 80
// unset) and memory (MiB); the metric defaults to cpu as in Knative; the
// windows average concurrency for cpu and memory; no burst capacity, no
// panic.
func TestHPAClass(t *testing.T) {
	hpa := func(o Overrides) *Overrides { o.Class = ptr.To(ClassHPA); return &o }
	tests := []struct {
		name              string
		annotations, spec *Overrides
		metric            string
		hpaTarget, value  float64
	}{
		{"concurrency target 10 at 70%: the HPA aims at 7", nil, hpa(Overrides{Metric: ptr.To(MetricConcurrency), Target: ptr.To(10.0)}), MetricConcurrency, 7, 7},
		{"rps target 50 at 80%: 40", nil, hpa(Overrides{Metric: ptr.To(MetricRPS), Target: ptr.To(50.0), TargetUtilizationPercentage: ptr.To(80.0)}), MetricRPS, 40, 40},
		{"no metric: cpu at 80%", nil, hpa(Overrides{}), MetricCPU, 80, 70},
		{"cpu target 55.5: 56%, the windows keep concurrency's 70", nil, hpa(Overrides{Metric: ptr.To(MetricCPU), Target: ptr.To(55.5)}), MetricCPU, 56, 70},
		{"memory target 256 MiB", nil, hpa(Overrides{Metric: ptr.To(MetricMemory), Target: ptr.To(256.0)}), MetricMemory, 256, 70},
		{"class from the annotation, metric from the spec", &Overrides{Class: ptr.To(ClassHPA)}, &Overrides{Metric: ptr.To(MetricRPS)}, MetricRPS, 140, 140},
		{"metric from the annotation is kept", &Overrides{Metric: ptr.To(MetricConcurrency)}, hpa(Overrides{}), MetricConcurrency, 70, 70},
	}
	for _, tt := range tests {
		s, err := Effective(Defaults(), 0, tt.annotations, tt.spec)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if s.Class != ClassHPA || s.Metric != tt.metric || abs(s.HPATarget-tt.hpaTarget) > 1e-9 || abs(s.TargetValue-tt.value) > 1e-9 {
			t.Errorf("%s: class %s metric %s HPA target %v value %v, want %s %s %v %v", tt.name, s.Class, s.Metric, s.HPATarget, s.TargetValue, ClassHPA, tt.metric, tt.hpaTarget, tt.value)
		}
		if s.TargetBurstCapacity != 0 || !math.IsInf(s.PanicThreshold, 1) {
			t.Errorf("%s: burst capacity %v panic threshold %v, want 0 and +Inf", tt.name, s.TargetBurstCapacity, s.PanicThreshold)
		}
	}
	if s, err := Effective(Defaults(), 0, nil, nil); err != nil || s.Class != ClassKPA || s.Metric != MetricConcurrency || s.TargetBurstCapacity != 211 {
		t.Errorf("no class: %+v, %v; want the KPA on concurrency with TBC 211", s, err)
	}
}

// TestRPSUtilizationIgnoresTheConcurrencyPercentage: as in Knative, the
// ConfigMap's container-concurrency-target-percentage is the concurrency
// metric's utilization only; rps aims at a fixed 70 % unless the target
// sets target-utilization-percentage.
func TestRPSUtilizationIgnoresTheConcurrencyPercentage(t *testing.T) {
	c, err := Parse(map[string]string{"container-concurrency-target-percentage": "50"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		spec *Overrides
		want float64
	}{
		{"concurrency: 100 * 50%", nil, 50},
		{"rps: 200 * 70%, the percentage does not apply", &Overrides{Metric: ptr.To(MetricRPS)}, 140},
		{"rps with target-utilization-percentage 90: 200 * 90%", &Overrides{Metric: ptr.To(MetricRPS), TargetUtilizationPercentage: ptr.To(90.0)}, 180},
	}
	for _, tt := range tests {
		s, err := Effective(c, 0, nil, tt.spec)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if abs(s.TargetValue-tt.want) > 1e-9 {
			t.Errorf("%s: target value %v, want %v", tt.name, s.TargetValue, tt.want)
		}
	}
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

func TestEffectivePrecedenceAndWindows(t *testing.T) {
	c := Defaults()
	ann, err := ParseAnnotations(map[string]string{
		AnnotationPrefix + "min-scale":               "2",
		AnnotationPrefix + "max-scale":               "8",
		AnnotationPrefix + "window":                  "10s",
		AnnotationPrefix + "panic-window-percentage": "15",
		"other.example.com/min-scale":                "99", // not ours
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Effective(c, 0, ann, &Overrides{MaxScale: ptr.To(int32(5))})
	if err != nil {
		t.Fatal(err)
	}
	// min from the annotation, max from the spec (which wins), windows from
	// the annotations: 10s * 15% = 1.5s, rounded to 2s.
	if s.MinScale != 2 || s.MaxScale != 5 || s.StableWindow != 10*time.Second || s.PanicWindow != 2*time.Second {
		t.Errorf("settings %+v", s)
	}
	d, _ := Effective(c, 0, nil, nil)
	if d.PanicWindow != 6*time.Second || d.PanicThreshold != 2 || d.TargetBurstCapacity != 211 {
		t.Errorf("default windows: panic %v threshold %v tbc %v", d.PanicWindow, d.PanicThreshold, d.TargetBurstCapacity)
	}
}

func TestAnnotationErrors(t *testing.T) {
	tests := []struct {
		key, value, want string
	}{
		{"activation-scale", "1", "must be a whole number >= 2"},
		{"metric", "gpu", `must be "concurrency" or "rps" (or, with class hpa.autoscaling.knative.dev, "cpu" or "memory")`},
		{"class", "hpa", `must be "kpa.autoscaling.knative.dev", "hpa.autoscaling.knative.dev" or "external.autoscaling.sockscale.dev"`},
		{"metric-aggregation-algorithm", "median", `must be "linear" or "weighted-exponential"`},
		{"window", "5s", "whole seconds from 6s to 1h"},
		{"target", "+Inf", "a number >= 0.01"},
		{"target-utilization-percentage", "0", "a percentage from 1 to 100"},
		{"panic-threshold-percentage", "50", "from 110 to 1000"},
		{"scale-down-delay", "2h", "whole seconds from 0s to 1h"},
		{"scale-down-delay", "61984ms", "whole seconds from 0s to 1h"}, // Knative: at most second precision
		{"min-scal", "1", "is not a per-target setting; known keys after autoscaling.knative.dev/: activation-scale,"},
	}
	for _, tt := range tests {
		_, err := ParseAnnotations(map[string]string{AnnotationPrefix + tt.key: tt.value})
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), AnnotationPrefix+tt.key) {
			t.Errorf("%s=%q: err = %v, want it to name the annotation and say %q", tt.key, tt.value, err, tt.want)
		}
	}
}

func TestEffectiveCrossKeyRules(t *testing.T) {
	limited := Defaults()
	limited.MaxScaleLimit = 10
	limited.MaxScale = 10
	tests := []struct {
		c    *Config
		cc   int32
		spec *Overrides
		want string
	}{
		{Defaults(), 0, &Overrides{MinScale: ptr.To(int32(4)), MaxScale: ptr.To(int32(3))}, "min-scale 4 is above max-scale 3"},
		{Defaults(), 0, &Overrides{ActivationScale: ptr.To(int32(5)), MaxScale: ptr.To(int32(3))}, "activation-scale 5 is above max-scale 3"},
		{limited, 0, &Overrides{MaxScale: ptr.To(int32(20))}, "max-scale 20: the cluster's max-scale-limit 10 allows 1 to 10"},
		{limited, 0, &Overrides{MaxScale: ptr.To(int32(0))}, "max-scale 0: the cluster's max-scale-limit 10"},
		{Defaults(), 0, &Overrides{Metric: ptr.To(MetricCPU)}, "metric cpu needs class hpa.autoscaling.knative.dev: the KPA scales on concurrency or rps"},
		{Defaults(), 0, &Overrides{Class: ptr.To(ClassKPA), Metric: ptr.To(MetricMemory)}, "metric memory needs class hpa.autoscaling.knative.dev"},
		{Defaults(), 0, &Overrides{Class: ptr.To(ClassHPA), Metric: ptr.To(MetricMemory)}, "metric memory needs a target (mebibytes per pod) with class hpa.autoscaling.knative.dev"},
		{Defaults(), 0, &Overrides{InitialScale: ptr.To(int32(0))}, "initial-scale 0 needs the cluster's allow-zero-initial-scale: true"},
		{Defaults(), -1, nil, "containerConcurrency -1: must be 0 (no limit) or more"},
		// Knative: activation-scale must be within min..max.
		{Defaults(), 0, &Overrides{MinScale: ptr.To(int32(4)), ActivationScale: ptr.To(int32(3))}, "min-scale 4 is above activation-scale 3"},
	}
	for _, tt := range tests {
		if _, err := Effective(tt.c, tt.cc, nil, tt.spec); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("err = %v, want %q", err, tt.want)
		}
	}
	// The cluster's min-scale is not the target's: as in Knative, only a
	// min-scale set for the target is held against its activation scale.
	high := Defaults()
	high.MinScale = 5
	if _, err := Effective(high, 0, nil, &Overrides{ActivationScale: ptr.To(int32(3))}); err != nil {
		t.Errorf("cluster min-scale 5 with activation-scale 3: %v", err)
	}
	ann, err := ParseAnnotations(map[string]string{AnnotationPrefix + "min-scale": "4"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Effective(Defaults(), 0, ann, &Overrides{ActivationScale: ptr.To(int32(3))}); err == nil || !strings.Contains(err.Error(), "min-scale 4 is above activation-scale 3") {
		t.Errorf("annotation min-scale 4, spec activation-scale 3: err = %v", err)
	}
}
