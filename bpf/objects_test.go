//go:build linux

package bpf

import (
	"maps"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"
)

// TestObjectsTestTupleOnlyInTestObject keeps the tests' four-tuple map out of
// the object the agent loads: only accountingtest, built with
// -DSOCKSCALE_TEST_TUPLE, has it, and neither object has load-time knobs.
func TestObjectsTestTupleOnlyInTestObject(t *testing.T) {
	for _, tc := range []struct {
		name     string
		load     func() (*ebpf.CollectionSpec, error)
		wantMaps []string
	}{
		{"accounting", loadAccounting, []string{"activators", "conn_store", "events", "pod_counters", "pod_slots"}},
		{"accountingtest", loadAccountingtest, []string{"activators", "conn_store", "conns", "events", "pod_counters", "pod_slots"}},
	} {
		spec, err := tc.load()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := slices.Sorted(maps.Keys(spec.Maps))
		if diff := cmp.Diff(tc.wantMaps, got); diff != "" {
			t.Errorf("%s maps (-want +got):\n%s", tc.name, diff)
		}
		if len(spec.Variables) != 0 {
			t.Errorf("%s has variables %v, want none", tc.name, slices.Sorted(maps.Keys(spec.Variables)))
		}
	}
}
