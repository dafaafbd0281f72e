package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"unsafe"

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
	// Opened as root before the user switch: the image's rootfs is below
	// the state dir, whose parents (~root) another user may not search;
	// execveat needs only the file's own execute bit, as in a container
	// whose root is the image.
	exe, err := openExecutable(spec.Rootfs, spec.Path, spec.Env)
	if err != nil {
		return err
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
	return fmt.Errorf("exec %s of the image: %w", spec.Path, execveat(exe, argv, spec.Env))
}

// openExecutable opens the container's executable in rootfs: p itself if
// it has a slash (relative to the image's root), else the first regular
// file named p in a directory of env's PATH. Symlinks are followed within
// rootfs only.
func openExecutable(rootfs, p string, env []string) (*os.File, error) {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return nil, fmt.Errorf("image rootfs: %w", err)
	}
	defer func() { _ = root.Close() }()
	var candidates []string
	if strings.Contains(p, "/") {
		candidates = []string{p}
	} else {
		pathVar := ""
		for _, kv := range env {
			if v, ok := strings.CutPrefix(kv, "PATH="); ok {
				pathVar = v
			}
		}
		for _, d := range filepath.SplitList(pathVar) {
			candidates = append(candidates, filepath.Join(d, p))
		}
	}
	for _, c := range candidates {
		rel := strings.TrimPrefix(filepath.Clean("/"+c), "/")
		fi, err := root.Stat(rel)
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			continue
		}
		return root.Open(rel)
	}
	return nil, fmt.Errorf("executable %q not found in the image (looked at %s)", p, strings.Join(candidates, ", "))
}

// execveat execs the file f (execveat(2) with AT_EMPTY_PATH).
func execveat(f *os.File, argv, env []string) error {
	argvp, err := syscall.SlicePtrFromStrings(argv)
	if err != nil {
		return err
	}
	envp, err := syscall.SlicePtrFromStrings(env)
	if err != nil {
		return err
	}
	empty, err := syscall.BytePtrFromString("")
	if err != nil {
		return err
	}
	_, _, errno := syscall.Syscall6(unix.SYS_EXECVEAT, f.Fd(), uintptr(unsafe.Pointer(empty)),
		uintptr(unsafe.Pointer(&argvp[0])), uintptr(unsafe.Pointer(&envp[0])), unix.AT_EMPTY_PATH, 0)
	return errno
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
