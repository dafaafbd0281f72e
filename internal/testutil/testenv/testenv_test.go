package testenv

import (
	"bufio"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestMakefileRoutesTheSamePrefixes keeps rootPrefixes and
// controlPlanePrefixes equal to the prefixes the Makefile routes to its
// privileged targets.
func TestMakefileRoutesTheSamePrefixes(t *testing.T) {
	_, file, _, _ := runtime.Caller(0)
	mk, err := os.Open(filepath.Join(filepath.Dir(file), "..", "..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	defer mk.Close()
	vars := map[string][]string{}
	sc := bufio.NewScanner(mk)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ":=")
		if name = strings.TrimSpace(name); ok && strings.HasSuffix(name, "_TEST_PREFIXES") {
			vars[name] = strings.Fields(value)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	var root []string
	for _, v := range []string{"BPF_TEST_PREFIXES", "INTEGRATION_TEST_PREFIXES", "E2E_TEST_PREFIXES"} {
		if len(vars[v]) == 0 {
			t.Fatalf("Makefile sets no %s", v)
		}
		root = append(root, vars[v]...)
	}
	if diff := cmp.Diff(root, rootPrefixes); diff != "" {
		t.Errorf("rootPrefixes differ from the Makefile's privileged prefixes (-Makefile +testenv):\n%s", diff)
	}
	plane := append(append([]string(nil), vars["INTEGRATION_TEST_PREFIXES"]...), vars["E2E_TEST_PREFIXES"]...)
	if diff := cmp.Diff(plane, controlPlanePrefixes); diff != "" {
		t.Errorf("controlPlanePrefixes differ from the Makefile's (-Makefile +testenv):\n%s", diff)
	}
}

// recorder is a testing.TB that records a Fatalf instead of ending the test.
type recorder struct {
	testing.TB
	name   string
	failed string
}

func (r *recorder) Name() string { return r.name }
func (r *recorder) Helper()      {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = format
}

func TestRequireRoutedFailsUnroutedNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail bool
	}{
		{"TestKernelAccuracy", false},
		{"FuzzProgMatchesModel/seed#0", false},
		{"TestE2EZDown/subtest", false},
		{"BenchmarkProgIngress", false},
		{"TestAgentNeedsRoot", true},
		{"TestKernel", false},
		{"TestIntegrationX", false},
	} {
		r := &recorder{TB: t, name: tc.name}
		requireRouted(r, "root", rootPrefixes)
		if got := r.failed != ""; got != tc.fail {
			t.Errorf("requireRouted(%q): failed = %v, want %v", tc.name, got, tc.fail)
		}
	}
	r := &recorder{TB: t, name: "TestKernelNeedsAPI"}
	requireRouted(r, "etcd and kube-apiserver", controlPlanePrefixes)
	if r.failed == "" {
		t.Error("a TestKernel* test that needs the control plane passed requireRouted; test-bpf does not build it")
	}
}
