package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// PodInit is the helper every container starts through (`sockscale-cluster
// pod-init <spec.json>`), already in the container's new mount and UTS
// namespaces and its cgroup (the simulator set those at clone). It enters
// the pod's netns, bind-mounts the volumes, sets the hostname, drops the
// capabilities the container may not have, switches user, and execs the
// container's binary; it returns only on error.
func PodInit(specPath string) error {
	b, err := os.ReadFile(specPath)
	if err != nil {
		return err
	}
	var spec initSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		return err
	}
	// Namespaces, credentials and capabilities below are per thread; the
	// exec happens from this one.
	runtime.LockOSThread()
	if spec.NetNS != "" {
		fd, err := unix.Open(spec.NetNS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open netns: %w", err)
		}
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("enter netns %s: %w", spec.NetNS, err)
		}
		_ = unix.Close(fd)
	}
	// Host mounts still propagate in; ours never leak out.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make / a slave mount: %w", err)
	}
	for _, m := range spec.Mounts {
		if err := bindMount(m, spec.CreatedLog); err != nil {
			return err
		}
	}
	if spec.ReadOnlyRoot {
		// Only this namespace's mount of /: the host's stays writable.
		if err := unix.Mount("", "/", "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("remount / read-only: %w", err)
		}
	}
	if err := unix.Sethostname([]byte(spec.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if spec.Dir != "" {
		if err := os.Chdir(spec.Dir); err != nil {
			return fmt.Errorf("workingDir: %w", err)
		}
	}
	if err := dropCaps(spec.Caps, spec.UID, spec.GID); err != nil {
		return err
	}
	if spec.NoNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("no_new_privs: %w", err)
		}
	}
	argv := append([]string{spec.Path}, spec.Args...)
	return fmt.Errorf("exec %s: %w", spec.Path, syscall.Exec(spec.Path, argv, spec.Env))
}

// bindMount mounts m.Source at m.Target, creating the target (a directory
// or an empty file, like the source) if the host has none; created paths
// are logged for `down`.
func bindMount(m mountSpec, createdLog string) error {
	st, err := os.Stat(m.Source)
	if err != nil {
		return fmt.Errorf("mount source: %w", err)
	}
	if _, err := os.Lstat(m.Target); errors.Is(err, os.ErrNotExist) {
		// Log the topmost missing directory: removing it removes the rest.
		top := m.Target
		for p := filepath.Dir(m.Target); p != "/"; p = filepath.Dir(p) {
			if _, err := os.Lstat(p); err == nil {
				break
			}
			top = p
		}
		if st.IsDir() {
			err = os.MkdirAll(m.Target, 0o755)
		} else if err = os.MkdirAll(filepath.Dir(m.Target), 0o755); err == nil {
			var f *os.File
			if f, err = os.OpenFile(m.Target, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
				err = f.Close()
			}
		}
		if err != nil {
			return fmt.Errorf("create mount point %s: %w", m.Target, err)
		}
		if f, err := os.OpenFile(createdLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
			fmt.Fprintln(f, top)
			f.Close()
		}
	}
	if err := unix.Mount(m.Source, m.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s at %s: %w", m.Source, m.Target, err)
	}
	if m.ReadOnly {
		if err := unix.Mount("", m.Target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("remount %s read-only: %w", m.Target, err)
		}
	}
	return nil
}

// dropCaps leaves the thread with exactly caps in its bounding, permitted
// and effective sets and none inheritable or ambient, after switching to
// gid and uid, as runc does for containerd: root keeps caps across exec
// (through the bounding set), any other user has none after exec, as on a
// real node (Kubernetes sets no ambient capabilities).
func dropCaps(caps []int, uid, gid *int64) error {
	keep := map[int]bool{}
	for _, c := range caps {
		keep[c] = true
	}
	for c := 0; c <= lastCap(); c++ {
		if !keep[c] {
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
				return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
			}
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	// The user first (it needs CAP_SETUID/SETGID, which caps may lack),
	// keeping the permitted set for the capset below.
	if err := unix.Prctl(unix.PR_SET_KEEPCAPS, 1, 0, 0, 0); err != nil {
		return err
	}
	if gid != nil {
		if err := syscall.Setgroups(nil); err != nil {
			return fmt.Errorf("setgroups: %w", err)
		}
		if err := syscall.Setresgid(int(*gid), int(*gid), int(*gid)); err != nil {
			return fmt.Errorf("setgid %d: %w", *gid, err)
		}
	}
	if uid != nil {
		if err := syscall.Setresuid(int(*uid), int(*uid), int(*uid)); err != nil {
			return fmt.Errorf("setuid %d: %w", *uid, err)
		}
	}
	var data [2]unix.CapUserData
	for _, c := range caps {
		data[c/32].Effective |= 1 << (uint(c) % 32)
		data[c/32].Permitted |= 1 << (uint(c) % 32)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}
