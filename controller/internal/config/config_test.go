package config

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestDefaultConfigMapParsesToDefaults(t *testing.T) {
	got, err := Parse(DefaultConfigMapData())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Defaults(), got); diff != "" {
		t.Errorf("parsed defaults (-want +got):\n%s", diff)
	}
	if len(DefaultConfigMapData()) != len(Keys()) {
		t.Errorf("default ConfigMap has %d keys, the parser knows %d", len(DefaultConfigMapData()), len(Keys()))
	}
}

func TestParseValues(t *testing.T) {
	got, err := Parse(map[string]string{
		"container-concurrency-target-percentage": "0.8", // a fraction
		"stable-window":              "30s",
		"panic-threshold-percentage": "300",
		"target-burst-capacity":      "-1",
		"_example":                   "documentation is ignored",
		"rollout-duration":           "90",
		"retain-since-create-time":   "disabled",
		"max-non-active-revisions":   "disabled",
		"min-non-active-revisions":   "3",
	})
	if err != nil {
		t.Fatal(err)
	}
	if got.Utilization != 0.8 || got.StableWindow != 30*time.Second || got.PanicThreshold != 3 || got.TargetBurstCapacity != -1 || got.RolloutDuration != 90*time.Second ||
		got.GC != (GC{RetainSinceCreate: Disabled, RetainSinceLastActive: 15 * time.Hour, MinNonActive: 3, MaxNonActive: Disabled}) {
		t.Errorf("parsed %+v", got)
	}
}

func TestParseErrorsNameKeyValueAndRange(t *testing.T) {
	tests := []struct {
		key, value, want string
	}{
		{"container-concurrency-target-percentage", "0", "percentage in (0, 100]"},
		{"container-concurrency-target-percentage", "150", "percentage in (0, 100]"},
		{"container-concurrency-target-default", "0", "a number >= 0.01"},
		{"requests-per-second-target-default", "lots", "a number >= 0.01"},
		{"target-burst-capacity", "-2", "must be -1 (activator always in the path), 0, or a positive number"},
		{"stable-window", "5s", "whole seconds from 6s to 1h"},
		{"stable-window", "90m", "whole seconds from 6s to 1h"},
		{"stable-window", "6500ms", "whole seconds from 6s to 1h"},
		{"panic-window-percentage", "0", "a percentage from 1 to 100"},
		{"panic-threshold-percentage", "100", "a percentage from 110 to 1000"},
		{"max-scale-up-rate", "1", "a number > 1"},
		{"max-scale-down-rate", "0.5", "a number > 1"},
		{"enable-scale-to-zero", "yes please", "true or false"},
		{"scale-to-zero-grace-period", "0s", "a duration from 1s to 1h"},
		{"scale-to-zero-pod-retention-period", "2h", "a duration from 0s to 1h"},
		{"activator-capacity", "0", "a number >= 1"},
		{"container-concurrency-target-default", "Inf", "a number >= 0.01"},
		{"max-scale-up-rate", "+Inf", "a number > 1"},
		{"initial-scale", "-1", "a whole number >= 0"},
		{"max-scale", "1.5", "a whole number >= 0"},
		{"scale-down-delay", "-1s", "whole seconds from 0s to 1h"},
		// Knative wants at most second precision.
		{"scale-down-delay", "61984ms", "whole seconds from 0s to 1h"},
		{"rollout-duration", "-1s", "whole seconds from 0s to 24h"},
		{"rollout-duration", "90.5s", "whole seconds from 0s to 24h"},
		{"rollout-duration", "25h", "whole seconds from 0s to 24h"},
		{"rollout-duration", "86401", "whole seconds from 0s to 24h"},
		{"rollout-duration", "soon", "whole seconds from 0s to 24h"},
		{"retain-since-create-time", "-1h", `a duration >= 0 (e.g. 48h) or "disabled"`},
		{"retain-since-last-active-time", "never", `a duration >= 0 (e.g. 48h) or "disabled"`},
		{"min-non-active-revisions", "-2", "a whole number >= 0"},
		{"max-non-active-revisions", "lots", `a whole number >= 0 or "disabled"`},
	}
	for _, tt := range tests {
		_, err := Parse(map[string]string{tt.key: tt.value})
		want := `key "` + tt.key + `": value "` + tt.value + `": `
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s=%q: err = %v, want %q ... %q", tt.key, tt.value, err, want, tt.want)
		}
	}
}

func TestParseReportsEveryError(t *testing.T) {
	_, err := Parse(map[string]string{"stable-window": "1s", "max-scale": "x"})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{`"stable-window"`, `"max-scale"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

// TestUnknownKeysAreIgnored: like Knative, keys the autoscaler does not
// know do not stop the ConfigMap from loading; UnknownKeys names them so
// the caller can warn (a typo then shows in the log, not as a dead config).
func TestUnknownKeysAreIgnored(t *testing.T) {
	data := map[string]string{"stable-window": "30s", "stabel-window": "60s", "pod-autoscaler-class": "kpa.autoscaling.knative.dev", "_example": "docs"}
	got, err := Parse(data)
	if err != nil {
		t.Fatalf("unknown keys rejected: %v", err)
	}
	if got.StableWindow != 30*time.Second {
		t.Errorf("stable window %v, want 30s", got.StableWindow)
	}
	if diff := cmp.Diff([]string{"pod-autoscaler-class", "stabel-window"}, UnknownKeys(data)); diff != "" {
		t.Errorf("unknown keys (-want +got):\n%s", diff)
	}
}

// TestKnativeExampleConfigMapParses: the values of Knative's shipped
// config-autoscaler example (its _example block copied into data, floats
// written as "10.0", pod-autoscaler-class included) are the defaults.
func TestKnativeExampleConfigMapParses(t *testing.T) {
	got, err := Parse(map[string]string{
		"container-concurrency-target-percentage": "70",
		"container-concurrency-target-default":    "100",
		"requests-per-second-target-default":      "200",
		"target-burst-capacity":                   "211",
		"stable-window":                           "60s",
		"panic-window-percentage":                 "10.0",
		"panic-threshold-percentage":              "200.0",
		"max-scale-up-rate":                       "1000.0",
		"max-scale-down-rate":                     "2.0",
		"enable-scale-to-zero":                    "true",
		"scale-to-zero-grace-period":              "30s",
		"scale-to-zero-pod-retention-period":      "0s",
		"pod-autoscaler-class":                    "kpa.autoscaling.knative.dev",
		"activator-capacity":                      "100.0",
		"initial-scale":                           "1",
		"allow-zero-initial-scale":                "false",
		"min-scale":                               "0",
		"max-scale":                               "0",
		"scale-down-delay":                        "0s",
		"max-scale-limit":                         "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Defaults(), got); diff != "" {
		t.Errorf("Knative's example (-want +got):\n%s", diff)
	}
}

func TestParseCrossKeyRules(t *testing.T) {
	tests := []struct {
		data map[string]string
		want string
	}{
		{map[string]string{"min-scale": "5", "max-scale": "3"}, "min-scale 5 is above max-scale 3"},
		{map[string]string{"max-scale-limit": "10"}, "max-scale 0: with max-scale-limit 10 it must be from 1 to 10"},
		{map[string]string{"max-scale-limit": "10", "max-scale": "11"}, "max-scale 11: with max-scale-limit 10"},
		{map[string]string{"initial-scale": "0"}, "initial-scale 0 needs allow-zero-initial-scale: true"},
		{map[string]string{"min-non-active-revisions": "30", "max-non-active-revisions": "10"}, "min-non-active-revisions 30 is above max-non-active-revisions 10"},
	}
	for _, tt := range tests {
		if _, err := Parse(tt.data); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: err = %v, want %q", tt.data, err, tt.want)
		}
	}
	if _, err := Parse(map[string]string{"initial-scale": "0", "allow-zero-initial-scale": "true"}); err != nil {
		t.Errorf("initial-scale 0 allowed: %v", err)
	}
}
