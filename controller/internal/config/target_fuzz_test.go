package config

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

// FuzzParseAnnotations: the autoscaling.knative.dev/* annotations are
// any tenant's input (the pod template of its own Deployment).
//
//	| input               | invariant                                                    |
//	|---------------------|--------------------------------------------------------------|
//	| accepted            | each value set inside its documented range, every number     |
//	|                     | finite; annotations not given stay unset (nil)               |
//	| accepted            | Effective with the defaults gives finite settings: a target  |
//	|                     | value >= 0.01, a panic window of whole seconds from 1s to    |
//	|                     | the stable window, or an error                               |
//	| refused             | the error names the annotation (prefix and key) and quotes   |
//	|                     | the value                                                    |
//	| other prefixes      | ignored                                                      |
func FuzzParseAnnotations(f *testing.F) {
	keys := (&Overrides{}).annotations()
	idx := func(k string) uint8 {
		for i, a := range keys {
			if a.key == k {
				return uint8(i)
			}
		}
		panic(k)
	}
	for _, kv := range [][2]string{
		{"min-scale", "2"}, {"max-scale", "8"}, {"window", "10s"}, {"panic-window-percentage", "15"}, {"target", "0.001"},
		{"metric", "rps"}, {"activation-scale", "1"}, {"scale-down-delay", "61984ms"}, {"target-burst-capacity", "-1"},
		{"metric-aggregation-algorithm", "weighted-exponential"}, {"target-utilization-percentage", "NaN"},
	} {
		f.Add(idx(kv[0]), kv[1], idx("min-scale"), "1", int32(0))
	}
	f.Add(idx("target"), "10", idx("metric"), "concurrency", int32(5))
	f.Fuzz(func(t *testing.T, k1 uint8, v1 string, k2 uint8, v2 string, cc int32) {
		n1, n2 := keys[int(k1)%len(keys)].key, keys[int(k2)%len(keys)].key
		ann := map[string]string{AnnotationPrefix + n1: v1, AnnotationPrefix + n2: v2, "example.com/" + n1: "ignored"}
		o, err := ParseAnnotations(ann)
		if err != nil {
			for _, k := range []string{n1, n2} {
				v := ann[AnnotationPrefix+k]
				if _, alone := ParseAnnotations(map[string]string{AnnotationPrefix + k: v}); alone != nil &&
					!strings.Contains(err.Error(), fmt.Sprintf("annotation %q: value %q", AnnotationPrefix+k, v)) {
					t.Errorf("ParseAnnotations(%q): error %q does not name %s with its value", ann, err, AnnotationPrefix+k)
				}
			}
			return
		}
		checkOverrides(t, ann, o, n1, n2)
		s, err := Effective(Defaults(), cc, o, nil)
		if err != nil {
			return
		}
		finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
		if !finite(s.Total) || !finite(s.TargetValue) || s.TargetValue < 0.01 || !finite(s.Utilization) || !finite(s.PanicThreshold) || !finite(s.TargetBurstCapacity) {
			t.Errorf("ParseAnnotations(%q), containerConcurrency %d: settings not finite: %+v", ann, cc, s)
		}
		if s.PanicWindow < time.Second || s.PanicWindow > s.StableWindow || s.PanicWindow%time.Second != 0 {
			t.Errorf("ParseAnnotations(%q): panic window %v outside 1s..%v", ann, s.PanicWindow, s.StableWindow)
		}
	})
}

// checkOverrides checks o against the documented ranges; only n1 and n2
// may be set.
func checkOverrides(t *testing.T, ann map[string]string, o *Overrides, n1, n2 string) {
	t.Helper()
	set := map[string]bool{n1: true, n2: true}
	finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
	check := func(key string, isSet bool, ok bool, v any) {
		switch {
		case isSet && !set[key]:
			t.Errorf("ParseAnnotations(%q) set %s, which is not given", ann, key)
		case isSet && !ok:
			t.Errorf("ParseAnnotations(%q) accepted %s = %v", ann, key, reflect.Indirect(reflect.ValueOf(v)))
		}
	}
	i32 := func(p *int32, lo int32) bool { return p == nil || *p >= lo }
	fl := func(p *float64, lo, hi float64) bool { return p == nil || (finite(*p) && *p >= lo && *p <= hi) }
	dur := func(p *time.Duration, lo, hi time.Duration, whole bool) bool {
		return p == nil || (*p >= lo && *p <= hi && (!whole || *p%time.Second == 0))
	}
	check("min-scale", o.MinScale != nil, i32(o.MinScale, 0), o.MinScale)
	check("max-scale", o.MaxScale != nil, i32(o.MaxScale, 0), o.MaxScale)
	check("initial-scale", o.InitialScale != nil, i32(o.InitialScale, 0), o.InitialScale)
	check("activation-scale", o.ActivationScale != nil, i32(o.ActivationScale, 2), o.ActivationScale)
	check("scale-down-delay", o.ScaleDownDelay != nil, dur(o.ScaleDownDelay, 0, time.Hour, true), o.ScaleDownDelay)
	check("metric", o.Metric != nil, o.Metric == nil || *o.Metric == MetricConcurrency || *o.Metric == MetricRPS, o.Metric)
	check("target", o.Target != nil, fl(o.Target, 0.01, math.MaxFloat64), o.Target)
	check("target-utilization-percentage", o.TargetUtilizationPercentage != nil, fl(o.TargetUtilizationPercentage, 1, 100), o.TargetUtilizationPercentage)
	check("target-burst-capacity", o.TargetBurstCapacity != nil,
		o.TargetBurstCapacity == nil || (finite(*o.TargetBurstCapacity) && (*o.TargetBurstCapacity >= 0 || *o.TargetBurstCapacity == -1)), o.TargetBurstCapacity)
	check("window", o.Window != nil, dur(o.Window, 6*time.Second, time.Hour, true), o.Window)
	check("panic-window-percentage", o.PanicWindowPercentage != nil, fl(o.PanicWindowPercentage, 1, 100), o.PanicWindowPercentage)
	check("panic-threshold-percentage", o.PanicThresholdPercentage != nil, fl(o.PanicThresholdPercentage, 110, 1000), o.PanicThresholdPercentage)
	check("scale-to-zero-pod-retention-period", o.ScaleToZeroPodRetentionPeriod != nil, dur(o.ScaleToZeroPodRetentionPeriod, 0, time.Hour, false), o.ScaleToZeroPodRetentionPeriod)
	check("metric-aggregation-algorithm", o.Aggregation != nil,
		o.Aggregation == nil || *o.Aggregation == AggregationLinear || *o.Aggregation == AggregationWeightedExponential, o.Aggregation)
}
