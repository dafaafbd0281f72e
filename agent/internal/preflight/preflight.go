package preflight

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"
)

// CheckCgroupRoot fails unless dir is a directory on a cgroup v2 file system.
func CheckCgroupRoot(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("cgroup root %s: %w (set --cgroup-root to where cgroup2 is mounted: see `grep cgroup2 /proc/mounts`)", dir, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return fmt.Errorf("cgroup root %s is not a cgroup v2 file system (magic %#x); on hybrid hosts cgroup2 is often at /sys/fs/cgroup/unified: see `grep cgroup2 /proc/mounts`", dir, st.Type)
	}
	return nil
}

// EnsureBPFFS makes sure pins under pinDir land on a bpffs, so they
// survive the agent. pinDir itself on a bpffs is enough: the chart mounts
// only the host's <bpffs>/sockscale into the container, whose parent is
// not a bpffs and must not be mounted over (that would hide the host's
// directory and its pins). A pinDir not there yet is made on its parent,
// which is then a bpffs, or made one if it is not (and we may).
func EnsureBPFFS(pinDir string) error {
	pinDir = filepath.Clean(pinDir)
	var st unix.Statfs_t
	if err := unix.Statfs(pinDir, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	} else if err == nil {
		return fmt.Errorf("--bpffs-dir=%s is not on a bpffs (magic %#x): mount the host's bpffs directory there (the chart mounts <agent.bpffs.hostPath>/sockscale), or give a directory on a bpffs", pinDir, st.Type)
	}
	parent := filepath.Dir(pinDir)
	if err := unix.Statfs(parent, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return fmt.Errorf("bpffs directory %s: %w", parent, err)
	}
	if err := unix.Mount("bpf", parent, "bpf", 0, ""); err != nil {
		return fmt.Errorf("%s is not a bpffs and mounting one failed: %w (mount it on the host with `mount -t bpf bpf %s`, and give the agent a hostPath volume of it with mountPropagation: Bidirectional)", parent, err, parent)
	}
	return nil
}

// CheckPermission fails unless this process may create BPF objects.
func CheckPermission() error {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("no permission to use BPF: the agent needs CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON (or CAP_SYS_ADMIN on kernels before 5.8): %w", err)
		}
		return fmt.Errorf("create a BPF map: %w", err)
	}
	return m.Close()
}

// feature is one kernel capability the accounting programs use.
type feature struct {
	name  string
	since string
	probe func() error
}

var needed = []feature{
	{"cgroup_skb programs", "4.10", func() error { return features.HaveProgramType(ebpf.CGroupSKB) }},
	{"sock_ops programs", "4.13", func() error { return features.HaveProgramType(ebpf.SockOps) }},
	{"bpf_loop helper", "5.17", func() error { return features.HaveProgramHelper(ebpf.CGroupSKB, asm.FnLoop) }},
	{"bpf_spin_lock helper", "5.1", func() error { return features.HaveProgramHelper(ebpf.CGroupSKB, asm.FnSpinLock) }},
	{"bpf_skb_load_bytes in cgroup_skb", "4.10", func() error { return features.HaveProgramHelper(ebpf.CGroupSKB, asm.FnSkbLoadBytes) }},
	{"bpf_sock_ops_cb_flags_set helper", "4.16", func() error { return features.HaveProgramHelper(ebpf.SockOps, asm.FnSockOpsCbFlagsSet) }},
}

// CheckKernel probes every kernel feature the programs need and names each
// that is missing.
func CheckKernel() error {
	var errs []error
	for _, f := range needed {
		if err := f.probe(); err != nil {
			if errors.Is(err, ebpf.ErrNotSupported) {
				errs = append(errs, fmt.Errorf("kernel lacks %s (Linux %s or newer)", f.name, f.since))
				continue
			}
			errs = append(errs, fmt.Errorf("probe %s: %w", f.name, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("unsupported kernel: %w", errors.Join(errs...))
	}
	return nil
}
