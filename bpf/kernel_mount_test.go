//go:build linux

package bpf

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// The chart's layout: the pin directory is the host's <bpffs>/sockscale
// bind-mounted alone below the container's read-only root. UninstallAll
// detaches everything and empties it, and leaves the mount point, which
// it cannot remove (EROFS, or EBUSY), without failing on it: a failure
// there once stopped the uninstall before the accounting's programs.
func TestKernelUninstallKeepsAMountedPinDir(t *testing.T) {
	testenv.RequireRoot(t)
	if err := testenv.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	hostDir := fmt.Sprintf("/sys/fs/bpf/sockscale-test-mounted-%d", os.Getpid())
	if err := os.Mkdir(hostDir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(hostDir) })
	// root stands for the container's read-only root, pinDir for the
	// mount point in it.
	root := t.TempDir()
	pinDir := filepath.Join(root, "bpffs")
	if err := os.Mkdir(pinDir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, m := range []struct {
		src, dst string
		flags    uintptr
	}{
		{root, root, unix.MS_BIND},
		{hostDir, pinDir, unix.MS_BIND},
		{"", root, unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY},
	} {
		if err := unix.Mount(m.src, m.dst, "", m.flags, ""); err != nil {
			t.Fatalf("mount %s at %s: %v", m.src, m.dst, err)
		}
	}
	t.Cleanup(func() {
		_ = unix.Unmount(pinDir, unix.MNT_DETACH)
		_ = unix.Unmount(root, unix.MNT_DETACH)
	})
	e := newKernelEnv(t, pinDir)
	if n := attachedPrograms(t, e.root); n != 3 {
		t.Fatalf("%d programs attached, want 3", n)
	}
	if err := e.acct.Close(); err != nil {
		t.Fatal(err)
	}
	if err := UninstallAll(pinDir); err != nil {
		t.Fatalf("UninstallAll: %v", err)
	}
	if n := attachedPrograms(t, e.root); n != 0 {
		t.Errorf("after UninstallAll %d programs are attached, want 0", n)
	}
	if entries, err := os.ReadDir(hostDir); err != nil || len(entries) != 0 {
		t.Errorf("host directory after UninstallAll: %d entries, %v; want empty", len(entries), err)
	}
}
