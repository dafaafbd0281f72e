package namedns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Dir holds one bind mount per named network namespace. /var/run is a link
// to /run, so this is iproute2's NETNS_RUN_DIR, and the netns package's.
const Dir = "/run/netns"

// Path is the file of network namespace name.
func Path(name string) string { return filepath.Join(Dir, name) }

// shareMu keeps this process from mounting a directory on itself twice.
var shareMu sync.Mutex

// shareDir makes dir (Dir) a shared mount point, as `ip netns add` does: a
// process that unshares its mounts (a pod's init) holds copies of the
// namespaces' bind mounts, and only a shared Dir passes our unmount on to
// those copies. Without it a deleted pod's namespace, its veth and its
// address live on while any other pod does.
func shareDir(dir string) error {
	shareMu.Lock()
	defer shareMu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	made := false
	for {
		err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EINVAL) || made {
			return fmt.Errorf("make %s a shared mount: %w", dir, err)
		}
		// EINVAL: not a mount point yet; it becomes one, on itself.
		if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind mount %s on itself: %w", dir, err)
		}
		made = true
	}
}

// Add creates network namespace name (only lo, down) and returns a handle
// to it, which the caller closes. It fails if name exists.
func Add(name string) (netns.NsHandle, error) {
	h, err := add(name)
	if err != nil {
		return netns.None(), fmt.Errorf("add netns %s: %w", name, err)
	}
	return h, nil
}

func add(name string) (netns.NsHandle, error) {
	if err := shareDir(Dir); err != nil {
		return netns.None(), err
	}
	p := Path(name)
	// The file first, exclusively: an existing namespace of that name is
	// refused and left alone.
	f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0)
	if err != nil {
		return netns.None(), err
	}
	f.Close()
	type result struct {
		h   netns.NsHandle
		err error
	}
	done := make(chan result, 1)
	go func() {
		// Unsharing moves this thread into the new namespace: the goroutine
		// is locked to its thread, which it unlocks only once it is back in
		// the original namespace. If it cannot get back the thread stays
		// locked, and the runtime ends it with the goroutine.
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{netns.None(), fmt.Errorf("open this thread's netns: %w", err)}
			return
		}
		defer func() { _ = orig.Close() }()
		h, err := netns.New()
		if err != nil {
			// unshare failed: the thread is where it was.
			runtime.UnlockOSThread()
			done <- result{netns.None(), fmt.Errorf("unshare: %w", err)}
			return
		}
		err = unix.Mount("/proc/thread-self/ns/net", p, "none", unix.MS_BIND, "")
		if err != nil {
			err = fmt.Errorf("bind mount onto %s: %w", p, err)
		}
		if serr := netns.Set(orig); serr == nil {
			runtime.UnlockOSThread()
		} else if err == nil {
			err = fmt.Errorf("back to the original netns: %w", serr)
		}
		if err != nil {
			_ = h.Close()
			h = netns.None()
		}
		done <- result{h, err}
	}()
	r := <-done
	if r.err != nil {
		// The file is ours (made above): nothing is mounted on it, or the
		// mount is undone with it.
		_ = unix.Unmount(p, unix.MNT_DETACH)
		_ = os.Remove(p)
	}
	return r.h, r.err
}

// Attach names the existing network namespace at path (e.g.
// /proc/self/ns/net) name, as `ip netns attach` does: a bind mount under
// Dir, so that a process that cannot open path (another's /proc entries)
// opens Path(name) instead.
func Attach(name, path string) error {
	if err := shareDir(Dir); err != nil {
		return fmt.Errorf("attach netns %s: %w", name, err)
	}
	p := Path(name)
	f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0)
	if err != nil {
		return fmt.Errorf("attach netns %s: %w", name, err)
	}
	f.Close()
	if err := unix.Mount(path, p, "none", unix.MS_BIND, ""); err != nil {
		_ = os.Remove(p)
		return fmt.Errorf("attach netns %s: bind mount %s: %w", name, path, err)
	}
	return nil
}

// Delete removes network namespace name, as `ip netns delete` does: the
// namespace goes once no process is in it and no handle holds it. An error
// for a name that does not exist wraps os.ErrNotExist.
func Delete(name string) error {
	err := netns.DeleteNamed(name)
	if errors.Is(err, unix.EINVAL) {
		// Not a mount point: a file an interrupted Add left; `ip netns
		// delete` removes it too.
		err = os.Remove(Path(name))
	}
	if err != nil {
		return fmt.Errorf("delete netns %s: %w", name, err)
	}
	return nil
}

// List returns the names of the named network namespaces, as `ip netns
// list` does (none if Dir does not exist).
func List() ([]string, error) {
	entries, err := os.ReadDir(Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list netns: %w", err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}
