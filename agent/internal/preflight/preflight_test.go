package preflight

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

func TestCheckCgroupRoot(t *testing.T) {
	if err := CheckCgroupRoot("/nonexistent/cgroup"); err == nil || !strings.Contains(err.Error(), "--cgroup-root") {
		t.Errorf("missing dir: err = %v, want advice about --cgroup-root", err)
	}
	if err := CheckCgroupRoot("/proc"); err == nil || !strings.Contains(err.Error(), "is not a cgroup v2 file system") {
		t.Errorf("/proc: err = %v", err)
	}
	root, err := cgroup2.Root()
	if err != nil {
		t.Skipf("no cgroup2 here: %v", err)
	}
	if err := CheckCgroupRoot(root); err != nil {
		t.Errorf("the real cgroup2 root %s: %v", root, err)
	}
}

func TestKernelProbesPass(t *testing.T) {
	testenv.RequireRoot(t)
	if err := CheckPermission(); err != nil {
		t.Fatal(err)
	}
	if err := CheckKernel(); err != nil {
		t.Fatal(err)
	}
	if err := EnsureBPFFS("/sys/fs/bpf/sockscale-preflight-test"); err != nil {
		t.Fatal(err)
	}
}

// The chart's layout: pinDir is a bpffs (the host's <bpffs>/sockscale,
// mounted alone) below a directory that is none. It is used as it is, and
// nothing is mounted over its parent, which would hide it.
func TestKernelEnsureBPFFSOwnDirectory(t *testing.T) {
	testenv.RequireRoot(t)
	parent := t.TempDir()
	pinDir := filepath.Join(parent, "sockscale")
	if err := os.Mkdir(pinDir, 0o700); err != nil {
		t.Fatal(err)
	}
	// A plain directory is refused, not mounted over.
	if err := EnsureBPFFS(pinDir); err == nil || !strings.Contains(err.Error(), "is not on a bpffs") {
		t.Errorf("plain directory: %v, want is not on a bpffs", err)
	}
	if err := unix.Mount("bpf", pinDir, "bpf", 0, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(pinDir, unix.MNT_DETACH) })
	if err := EnsureBPFFS(pinDir); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(parent, &st); err != nil || st.Type == unix.BPF_FS_MAGIC {
		t.Errorf("parent %s: %v, magic %#x: a bpffs was mounted over it", parent, err, st.Type)
	}
}
