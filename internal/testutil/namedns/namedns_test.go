package namedns

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

func TestKernelAddListDelete(t *testing.T) {
	testenv.RequireRoot(t)
	name := fmt.Sprintf("sstest-namedns-%d", os.Getpid())
	h, err := Add(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Delete(name) })
	defer h.Close()

	host, err := netns.GetFromPid(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	if h.Equal(host) {
		t.Fatal("the new namespace is the host's")
	}
	named, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer named.Close()
	if !named.Equal(h) {
		t.Errorf("%s is not the namespace Add returned", Path(name))
	}
	// The process's threads all stayed in the host's namespace.
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", os.Getpid()))
	for _, task := range tasks {
		ns, err := netns.GetFromPath(fmt.Sprintf("/proc/%d/task/%s/ns/net", os.Getpid(), task.Name()))
		if err != nil {
			continue // a thread that just ended
		}
		if !ns.Equal(host) {
			t.Errorf("thread %s is in another netns after Add", task.Name())
		}
		ns.Close()
	}

	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	links, err := nh.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	if len(links) != 1 || links[0].Attrs().Name != "lo" {
		t.Errorf("links in the new namespace: %v, want only lo", links)
	}

	if n := sharedMounts(t, Dir); n == 0 {
		t.Errorf("%s is not a shared mount point", Dir)
	}

	if _, err := Add(name); !errors.Is(err, os.ErrExist) || !strings.Contains(err.Error(), "add netns "+name) {
		t.Errorf("second Add: %v, want an error naming the namespace that wraps ErrExist", err)
	}
	names, err := List()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(names, name) {
		t.Errorf("List() = %v, without %s", names, name)
	}
	if err := Delete(name); err != nil {
		t.Fatal(err)
	}
	if err := Delete(name); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("second Delete: %v, want ErrNotExist", err)
	}
	// A file an interrupted Add left (nothing mounted on it) goes too.
	if err := os.WriteFile(Path(name), nil, 0); err != nil {
		t.Fatal(err)
	}
	if err := Delete(name); err != nil {
		t.Errorf("Delete of an unmounted file: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(Path(name), &st); !errors.Is(err, unix.ENOENT) {
		t.Errorf("%s still there: %v", Path(name), err)
	}
}

// A directory that is no mount point becomes one, shared, and only once.
func TestKernelShareDir(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	t.Cleanup(func() {
		for unix.Unmount(dir, unix.MNT_DETACH) == nil {
		}
	})
	for range 2 {
		if err := shareDir(dir); err != nil {
			t.Fatal(err)
		}
	}
	if n := sharedMounts(t, dir); n != 1 {
		t.Errorf("%s: %d shared mounts, want 1", dir, n)
	}
}

// sharedMounts counts the shared mounts at dir.
func sharedMounts(t *testing.T, dir string) int {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(mi), "\n") {
		// id parent major:minor root mount-point options optional... - ...
		if f := strings.Fields(line); len(f) > 6 && f[4] == dir && strings.HasPrefix(f[6], "shared:") {
			n++
		}
	}
	return n
}
