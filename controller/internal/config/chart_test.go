package config

import (
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// chartDepartures are the chart's deliberate departures from Knative's
// defaults (test/chart keeps the same list): target-burst-capacity 0, the
// activators in a target's path only at zero.
var chartDepartures = map[string]string{"target-burst-capacity": "0"}

// TestChartDefaultsAreTheDefaults: the Helm chart's autoscaler ConfigMap
// (values.yaml's autoscaler block) is exactly DefaultConfigMapData but for
// chartDepartures and parses to Defaults but for them, so a fresh install
// behaves like a missing ConfigMap in everything else.
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
	want := DefaultConfigMapData()
	maps.Copy(want, chartDepartures)
	if diff := cmp.Diff(want, values.Autoscaler); diff != "" {
		t.Errorf("chart autoscaler values differ from DefaultConfigMapData and chartDepartures (-want +got):\n%s", diff)
	}
	got, err := Parse(values.Autoscaler)
	if err != nil {
		t.Fatal(err)
	}
	wantCfg := Defaults()
	wantCfg.TargetBurstCapacity = 0
	if diff := cmp.Diff(wantCfg, got); diff != "" {
		t.Errorf("chart defaults parse to (-want +got):\n%s", diff)
	}
}
