package config

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// TestChartDefaultsAreTheDefaults: the Helm chart's autoscaler ConfigMap
// (values.yaml's autoscaler block) is exactly DefaultConfigMapData and
// parses to Defaults, so a fresh install behaves like a missing ConfigMap.
func TestChartDefaultsAreTheDefaults(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	raw, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "..", "charts", "sockscale", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Autoscaler map[string]string `json:"autoscaler"`
	}
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatalf("values.yaml: %v (autoscaler values must be strings)", err)
	}
	if diff := cmp.Diff(DefaultConfigMapData(), values.Autoscaler); diff != "" {
		t.Errorf("chart autoscaler values differ from DefaultConfigMapData (-want +got):\n%s", diff)
	}
	got, err := Parse(values.Autoscaler)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Defaults(), got); diff != "" {
		t.Errorf("chart defaults parse to (-want +got):\n%s", diff)
	}
}
