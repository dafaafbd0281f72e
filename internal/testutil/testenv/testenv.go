package testenv

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// RequireRoot skips t when not root, and fails it instead when CI=true: in
// CI a skipped privileged test would hide that it never ran.
func RequireRoot(t testing.TB) {
	t.Helper()
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
// built, and fails it instead under CI=true.
func RequireControlPlane(t testing.TB) {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") != "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("KUBEBUILDER_ASSETS is not set: run through `make test-integration`, which builds etcd and kube-apiserver")
	}
	t.Skip("KUBEBUILDER_ASSETS is not set: run `make test-integration` (builds etcd and kube-apiserver)")
}
