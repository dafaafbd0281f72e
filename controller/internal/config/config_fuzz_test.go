package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// FuzzParse: the autoscaler ConfigMap is written by whoever may edit it;
// a bad value must be refused with its key, never reach the deciders.
//
//	| input               | invariant                                                    |
//	|---------------------|--------------------------------------------------------------|
//	| accepted            | every field inside the range docs/autoscaling.md documents;  |
//	|                     | every number finite                                          |
//	| accepted            | cross-key rules hold (min <= max, max-scale-limit, GC,       |
//	|                     | initial-scale 0 only with allow-zero-initial-scale)          |
//	| accepted            | Parse(format(c)) == c (format: the test's own formatter)     |
//	| refused             | the error names a key of the input; a value refused on its   |
//	|                     | own is quoted with its key                                   |
func FuzzParse(f *testing.F) {
	keys := Keys()
	idx := func(k string) uint8 {
		for i, x := range keys {
			if x == k {
				return uint8(i)
			}
		}
		panic(k)
	}
	for _, kv := range [][2]string{
		{"container-concurrency-target-percentage", "0.8"}, {"stable-window", "30s"}, {"panic-threshold-percentage", "300"},
		{"target-burst-capacity", "-1"}, {"rollout-duration", "90"}, {"retain-since-create-time", "disabled"},
		{"max-non-active-revisions", "disabled"}, {"container-concurrency-target-default", "0"}, {"stable-window", "6500ms"},
		{"scale-down-delay", "61984ms"}, {"max-scale", "1.5"}, {"activator-capacity", "1e309"}, {"max-scale-up-rate", "NaN"},
	} {
		f.Add(idx(kv[0]), kv[1], idx("min-scale"), "0")
	}
	f.Add(idx("initial-scale"), "0", idx("allow-zero-initial-scale"), "true")
	f.Add(idx("min-scale"), "3", idx("max-scale"), "2")
	f.Fuzz(func(t *testing.T, k1 uint8, v1 string, k2 uint8, v2 string) {
		data := map[string]string{keys[int(k1)%len(keys)]: v1, keys[int(k2)%len(keys)]: v2}
		c, err := Parse(data)
		if err != nil {
			msg := err.Error()
			named := false
			for k, v := range data {
				named = named || strings.Contains(msg, k)
				var alone field
				for _, f := range fields {
					if f.key == k {
						alone = f
					}
				}
				if alone.parse(Defaults(), strings.TrimSpace(v)) != nil && !strings.Contains(msg, fmt.Sprintf("key %q: value %q", k, v)) {
					t.Errorf("Parse(%q): error %q does not name key %q with its value", data, msg, k)
				}
			}
			if !named {
				t.Errorf("Parse(%q): error %q names none of the keys", data, msg)
			}
			return
		}
		checkConfig(t, data, c)
		again, err := Parse(format(c))
		if err != nil {
			t.Fatalf("Parse(%q) = %+v, but its formatted form %q is refused: %v", data, c, format(c), err)
		}
		if diff := cmp.Diff(c, again, cmpopts.EquateApprox(1e-12, 0)); diff != "" {
			t.Errorf("Parse(%q): Parse(format(c)) differs (-first +again):\n%s", data, diff)
		}
	})
}

// checkConfig checks c against the documented ranges.
func checkConfig(t *testing.T, data map[string]string, c *Config) {
	t.Helper()
	bad := func(what string, v any) { t.Errorf("Parse(%q) accepted %s = %v", data, what, v) }
	finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
	whole := func(d time.Duration) bool { return d%time.Second == 0 }
	if !finite(c.Utilization) || c.Utilization <= 0 || c.Utilization > 1 {
		bad("utilization", c.Utilization)
	}
	if !finite(c.ConcurrencyTargetDefault) || c.ConcurrencyTargetDefault < 0.01 {
		bad("container-concurrency-target-default", c.ConcurrencyTargetDefault)
	}
	if !finite(c.RPSTargetDefault) || c.RPSTargetDefault < 0.01 {
		bad("requests-per-second-target-default", c.RPSTargetDefault)
	}
	if !finite(c.TargetBurstCapacity) || (c.TargetBurstCapacity < 0 && c.TargetBurstCapacity != -1) {
		bad("target-burst-capacity", c.TargetBurstCapacity)
	}
	if c.StableWindow < 6*time.Second || c.StableWindow > time.Hour || !whole(c.StableWindow) {
		bad("stable-window", c.StableWindow)
	}
	if !finite(c.PanicWindowPercentage) || c.PanicWindowPercentage < 1 || c.PanicWindowPercentage > 100 {
		bad("panic-window-percentage", c.PanicWindowPercentage)
	}
	if !finite(c.PanicThreshold) || c.PanicThreshold < 1.1 || c.PanicThreshold > 10 {
		bad("panic-threshold", c.PanicThreshold)
	}
	if !finite(c.MaxScaleUpRate) || c.MaxScaleUpRate <= 1 {
		bad("max-scale-up-rate", c.MaxScaleUpRate)
	}
	if !finite(c.MaxScaleDownRate) || c.MaxScaleDownRate <= 1 {
		bad("max-scale-down-rate", c.MaxScaleDownRate)
	}
	if c.ScaleToZeroGracePeriod < time.Second || c.ScaleToZeroGracePeriod > time.Hour {
		bad("scale-to-zero-grace-period", c.ScaleToZeroGracePeriod)
	}
	if c.ScaleToZeroPodRetentionPeriod < 0 || c.ScaleToZeroPodRetentionPeriod > time.Hour {
		bad("scale-to-zero-pod-retention-period", c.ScaleToZeroPodRetentionPeriod)
	}
	if !finite(c.ActivatorCapacity) || c.ActivatorCapacity < 1 {
		bad("activator-capacity", c.ActivatorCapacity)
	}
	if c.InitialScale < 0 || (c.InitialScale == 0 && !c.AllowZeroInitialScale) {
		bad("initial-scale", c.InitialScale)
	}
	if c.MinScale < 0 || c.MaxScale < 0 || (c.MaxScale > 0 && c.MinScale > c.MaxScale) {
		bad("min-scale/max-scale", [2]int32{c.MinScale, c.MaxScale})
	}
	if c.MaxScaleLimit < 0 || (c.MaxScaleLimit > 0 && (c.MaxScale < 1 || c.MaxScale > c.MaxScaleLimit)) {
		bad("max-scale/max-scale-limit", [2]int32{c.MaxScale, c.MaxScaleLimit})
	}
	if c.ScaleDownDelay < 0 || c.ScaleDownDelay > time.Hour || !whole(c.ScaleDownDelay) {
		bad("scale-down-delay", c.ScaleDownDelay)
	}
	if c.RolloutDuration < 0 || c.RolloutDuration > MaxRolloutDuration || !whole(c.RolloutDuration) {
		bad("rollout-duration", c.RolloutDuration)
	}
	if c.GC.RetainSinceCreate < 0 && c.GC.RetainSinceCreate != Disabled {
		bad("retain-since-create-time", c.GC.RetainSinceCreate)
	}
	if c.GC.RetainSinceLastActive < 0 && c.GC.RetainSinceLastActive != Disabled {
		bad("retain-since-last-active-time", c.GC.RetainSinceLastActive)
	}
	if c.GC.MinNonActive < 0 || (c.GC.MaxNonActive != Disabled && (c.GC.MaxNonActive < 0 || c.GC.MinNonActive > c.GC.MaxNonActive)) {
		bad("min/max-non-active-revisions", [2]int32{c.GC.MinNonActive, c.GC.MaxNonActive})
	}
}

// format writes c as ConfigMap data, as an operator would.
func format(c *Config) map[string]string {
	fl := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	or := func(d time.Duration) string {
		if d == Disabled {
			return "disabled"
		}
		return d.String()
	}
	n := func(i int32) string { return strconv.Itoa(int(i)) }
	maxNonActive := n(c.GC.MaxNonActive)
	if c.GC.MaxNonActive == Disabled {
		maxNonActive = "disabled"
	}
	// A percentage of 1 or less reads as a fraction: write such as one.
	utilization := fl(c.Utilization * 100)
	if c.Utilization <= 0.01 {
		utilization = fl(c.Utilization)
	}
	return map[string]string{
		"container-concurrency-target-percentage": utilization,
		"container-concurrency-target-default":    fl(c.ConcurrencyTargetDefault),
		"requests-per-second-target-default":      fl(c.RPSTargetDefault),
		"target-burst-capacity":                   fl(c.TargetBurstCapacity),
		"stable-window":                           c.StableWindow.String(),
		"panic-window-percentage":                 fl(c.PanicWindowPercentage),
		"panic-threshold-percentage":              fl(c.PanicThreshold * 100),
		"max-scale-up-rate":                       fl(c.MaxScaleUpRate),
		"max-scale-down-rate":                     fl(c.MaxScaleDownRate),
		"enable-scale-to-zero":                    strconv.FormatBool(c.EnableScaleToZero),
		"scale-to-zero-grace-period":              c.ScaleToZeroGracePeriod.String(),
		"scale-to-zero-pod-retention-period":      c.ScaleToZeroPodRetentionPeriod.String(),
		"activator-capacity":                      fl(c.ActivatorCapacity),
		"initial-scale":                           n(c.InitialScale),
		"allow-zero-initial-scale":                strconv.FormatBool(c.AllowZeroInitialScale),
		"min-scale":                               n(c.MinScale),
		"max-scale":                               n(c.MaxScale),
		"scale-down-delay":                        c.ScaleDownDelay.String(),
		"max-scale-limit":                         n(c.MaxScaleLimit),
		"rollout-duration":                        c.RolloutDuration.String(),
		"retain-since-create-time":                or(c.GC.RetainSinceCreate),
		"retain-since-last-active-time":           or(c.GC.RetainSinceLastActive),
		"min-non-active-revisions":                n(c.GC.MinNonActive),
		"max-non-active-revisions":                maxNonActive,
		KeyVolumesEmptyDir:                        featureValue(c.PodSpec.VolumesEmptyDir),
		KeyVolumesHostPath:                        featureValue(c.PodSpec.VolumesHostPath),
		KeyPersistentVolumeClaim:                  featureValue(c.PodSpec.PersistentVolumeClaim),
		KeyNodeSelector:                           featureValue(c.PodSpec.NodeSelector),
		KeyTolerations:                            featureValue(c.PodSpec.Tolerations),
		KeySecurityContext:                        featureValue(c.PodSpec.SecurityContext),
		KeyAddCapabilities:                        featureValue(c.PodSpec.AddCapabilities),
	}
}

// featureValue writes a pod-spec key's value.
func featureValue(on bool) string {
	if on {
		return "enabled"
	}
	return "disabled"
}
