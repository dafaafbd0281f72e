package preflight

import (
	"strings"
	"testing"

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
