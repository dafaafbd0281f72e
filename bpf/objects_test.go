//go:build linux

package bpf

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"

	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestObjectsTestTupleOnlyInTestObject keeps the tests' maps and programs
// out of the object the agent loads: only accountingtest, built with
// -DSOCKSCALE_TEST_TUPLE, has the four-tuple map and the drop rules (and
// sockscale_test_accept, sockscale_test_drop), and neither object has
// load-time knobs.
func TestObjectsTestTupleOnlyInTestObject(t *testing.T) {
	for _, tc := range []struct {
		name     string
		load     func() (*ebpf.CollectionSpec, error)
		wantMaps []string
	}{
		{"accounting", loadAccounting, []string{"activators", "conn_adjusts", "conn_scratch", "conn_store", "conn_zero", "drain_seen", "draining", "events", "h2_stash", "h2_store", "h2_zero", "learned", "node_addrs", "pod_counters", "pod_slots", "stash"}},
		{"accountingtest", loadAccountingtest, []string{"activators", "conn_adjusts", "conn_scratch", "conn_store", "conn_zero", "conns", "drain_seen", "draining", "drop_rules", "events", "h2_conns", "h2_stash", "h2_store", "h2_zero", "learned", "node_addrs", "pod_counters", "pod_slots", "stash", "test_sockets"}},
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

// TestProgVerifierCost loads both objects with the verifier's statistics
// and logs, per program, its size and how many instructions the verifier
// processed (the limit is 1,000,000): run with -v to read them. It fails
// only if a program does not load.
func TestProgVerifierCost(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tc := range []struct {
		name string
		load func() (*ebpf.CollectionSpec, error)
	}{{"accounting", loadAccounting}, {"accountingtest", loadAccountingtest}} {
		spec, err := tc.load()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats}})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for _, name := range slices.Sorted(maps.Keys(coll.Programs)) {
			p := coll.Programs[name]
			stats := ""
			for _, line := range strings.Split(p.VerifierLog, "\n") {
				if strings.HasPrefix(line, "processed ") {
					stats = line
				}
			}
			t.Logf("%s %s: %d instructions; %s", tc.name, name, len(spec.Programs[name].Instructions), stats)
		}
		coll.Close()
	}
}
