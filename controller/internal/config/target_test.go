package config

import (
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
		{"metric", "cpu", `must be "concurrency" or "rps"`},
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
