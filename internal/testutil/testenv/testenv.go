package testenv

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The Makefile routes privileged tests to the target that can run them by
// their names' prefixes (BPF_TEST_PREFIXES, ...; TestMakefileRoutesTheSamePrefixes
// keeps these lists equal to its). A test that needs root or the control
// plane under any other name would be skipped by test-unit and run by no
// target, so the Require functions fail it instead.
var (
	// rootPrefixes need root: kernel-only, control-plane and cluster tests.
	rootPrefixes = []string{"TestKernel", "TestProg", "FuzzProg", "TestIntegration", "TestE2E"}
	// controlPlanePrefixes run where make has built etcd and kube-apiserver.
	controlPlanePrefixes = []string{"TestIntegration", "TestE2E"}
)

// requireRouted fails t unless its top-level name starts with one of
// prefixes. Benchmarks are exempt: `make bench` runs them all, as root.
func requireRouted(t testing.TB, needs string, prefixes []string) {
	t.Helper()
	name, _, _ := strings.Cut(t.Name(), "/")
	if strings.HasPrefix(name, "Benchmark") {
		return
	}
	for _, p := range prefixes {
		if strings.HasPrefix(name, p) {
			return
		}
	}
	t.Fatalf("%s needs %s, so its name must start with one of %s: the Makefile picks privileged tests by these prefixes, and no target would run it otherwise",
		name, needs, strings.Join(prefixes, ", "))
}

// RequireRoot skips t when not root, and fails it instead when CI=true: in
// CI a skipped privileged test would hide that it never ran. It fails a
// test whose name no privileged target runs.
func RequireRoot(t testing.TB) {
	t.Helper()
	requireRouted(t, "root", rootPrefixes)
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("this test needs root (BPF, network namespaces, cgroups); CI=true forbids skipping it")
	}
	t.Skip("needs root (BPF, network namespaces, cgroups)")
}

// EnsureBPFFS mounts a bpffs at dir unless one is there.
func EnsureBPFFS(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, ""); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", dir, err)
	}
	return nil
}

// RequireControlPlane skips a test that needs the pinned etcd and
// kube-apiserver (KUBEBUILDER_ASSETS, set by the Makefile) when they are not
// built, and fails it instead under CI=true. It fails a test whose name no
// control-plane target runs.
func RequireControlPlane(t testing.TB) {
	t.Helper()
	requireRouted(t, "etcd and kube-apiserver", controlPlanePrefixes)
	if os.Getenv("KUBEBUILDER_ASSETS") != "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run through `make test-integration`, which builds etcd and kube-apiserver")
	}
	t.Skip("KUBEBUILDER_ASSETS is not set: run `make test-integration` (builds etcd and kube-apiserver)")
}
