package cluster

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
)

// What a real node makes on the host besides its processes: cgroups in
// every hierarchy, mounts, portmap's iptables rules, CNI's cache.

// cgroupV1Mounts lists the mount points of the cgroup v1 hierarchies (none
// on a cgroup v2 only host; cpu, memory, ... and name=systemd on a hybrid
// one), one per hierarchy.
func cgroupV1Mounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	seen := map[string]bool{}
	var mounts []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		// id parent major:minor root mount-point options ... - fstype source super-options
		fields := strings.Fields(s.Text())
		for i, fl := range fields {
			if fl == "-" && i+2 < len(fields) && fields[i+1] == "cgroup" && len(fields) > 4 {
				// A hierarchy mounted twice is one hierarchy: its
				// controllers (super options) name it.
				if key := fields[i+3]; !seen[key] {
					seen[key] = true
					mounts = append(mounts, fields[4])
				}
			}
		}
	}
	return mounts, s.Err()
}

// nodeCgroupDirs are the node's cgroup directories: in the v2 hierarchy
// and in every v1 one.
func nodeCgroupDirs(parent string) ([]string, error) {
	v2, err := cgroup2.Root()
	if err != nil {
		return nil, err
	}
	v1, err := cgroupV1Mounts()
	if err != nil {
		return nil, err
	}
	dirs := []string{filepath.Join(v2, parent)}
	for _, m := range v1 {
		dirs = append(dirs, filepath.Join(m, parent))
	}
	return dirs, nil
}

// makeNodeCgroups makes the node's cgroup (the kubelet's cgroupRoot) in
// every hierarchy: the kubelet wants it to exist in all of them and makes
// only kubepods below it.
func makeNodeCgroups(parent string) error {
	dirs, err := nodeCgroupDirs(parent)
	if err != nil {
		return err
	}
	for i, d := range dirs {
		if err := mkdirCgroup(d, i > 0); err != nil {
			return err
		}
	}
	return nil
}

// mkdirCgroup makes a cgroup directory and its missing parents. In the v1
// cpuset hierarchy a new cgroup has no CPUs and no memory nodes, and no
// process may join it or its children until they are set: each level
// gets its parent's.
func mkdirCgroup(dir string, v1 bool) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := mkdirCgroup(filepath.Dir(dir), v1); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("make cgroup %s: %w", dir, err)
	}
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		own := filepath.Join(dir, f)
		cur, err := os.ReadFile(own)
		if !v1 || err != nil || strings.TrimSpace(string(cur)) != "" {
			continue // not a v1 cpuset cgroup, or already set
		}
		parentVal, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(own, parentVal, 0); err != nil {
			return fmt.Errorf("set %s: %w", own, err)
		}
	}
	return nil
}

// killNodeCgroups kills every process in the node's cgroups, in every
// hierarchy: the v2 subtree holds the daemons, the shims and (started by
// the shims) the containers; runc may have moved containers to cgroups of
// the v1 hierarchies only, so those are emptied too.
func killNodeCgroups(parent string) error {
	dirs, err := nodeCgroupDirs(parent)
	if err != nil {
		return err
	}
	// cgroup.kill of the v2 subtree, then whatever the v1 trees still hold.
	_ = os.WriteFile(filepath.Join(dirs[0], "cgroup.kill"), []byte("1"), 0)
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []int
		for _, d := range dirs {
			_ = filepath.WalkDir(d, func(p string, e os.DirEntry, err error) error {
				if err == nil && e.IsDir() {
					for _, pid := range cgroupPIDs(p) {
						_ = unix.Kill(pid, unix.SIGKILL)
						left = append(left, pid)
					}
				}
				return nil
			})
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes left in the cgroups of %s: %v", parent, left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// removeNodeCgroups removes the node's cgroup directories, emptied by
// killNodeCgroups, bottom-up in every hierarchy.
func removeNodeCgroups(parent string) error {
	dirs, err := nodeCgroupDirs(parent)
	if err != nil {
		return err
	}
	var errs []error
	for _, d := range dirs {
		if err := killCgroupTree(d); err != nil {
			errs = append(errs, err)
		}
		// The parents made for it, if nothing else is in them now: rmdir
		// fails on a cgroup with children or processes.
		p := d
		for range strings.Count(filepath.Clean(parent), "/") {
			p = filepath.Dir(p)
			_ = os.Remove(p)
		}
	}
	return errors.Join(errs...)
}

// unmountBelow unmounts every mount point at or below dir, deepest first
// (lazily: a mount still in use goes when it is no longer).
func unmountBelow(dir string) error {
	dir = filepath.Clean(dir)
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("read mounts: %w", err)
	}
	var points []string
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountPath(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			points = append(points, mp)
		}
	}
	// Deepest first: a rootfs's mounts before the rootfs.
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var errs []error
	for _, mp := range points {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var out strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				out.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		out.WriteByte(s[i])
	}
	return out.String()
}

// portmap's chains in the nat table: a CNI-DN-<hash> chain per container
// with hostPorts, jumped to from CNI-HOSTPORT-DNAT by a rule whose comment
// names the network; CNI-HOSTPORT-DNAT/-SETMARK/-MASQ are shared by every
// network on the host and jumped to from PREROUTING, OUTPUT and
// POSTROUTING.
var portmapTopChains = []string{"CNI-HOSTPORT-DNAT", "CNI-HOSTPORT-SETMARK", "CNI-HOSTPORT-MASQ"}

// removePortmapRules removes the rules portmap made for network (the
// containers' CNI DEL did not run: containerd was killed), then the shared
// chains if no other network has rules in them; in ip6tables too, where
// portmap puts the hostPorts of a dual-stack node's pods' IPv6 addresses.
func removePortmapRules(network string) error {
	return errors.Join(removePortmapRulesOf("iptables", network), removePortmapRulesOf("ip6tables", network))
}

// removePortmapRulesOf is removePortmapRules for one family (ipt: iptables
// or ip6tables).
func removePortmapRulesOf(ipt, network string) error {
	if run(ipt, "-w", "-t", "nat", "-S", "CNI-HOSTPORT-DNAT") != nil {
		return nil // portmap never ran here
	}
	var errs []error
	targets, err := deleteNATRules(ipt, "CNI-HOSTPORT-DNAT", func(comment, _ string) bool {
		return strings.Contains(comment, fmt.Sprintf(`dnat name: "%s"`, network))
	})
	if err != nil {
		errs = append(errs, err)
	}
	for _, chain := range targets {
		if err := run(ipt, "-w", "-t", "nat", "-F", chain); err != nil {
			errs = append(errs, err)
		}
		if err := run(ipt, "-w", "-t", "nat", "-X", chain); err != nil {
			errs = append(errs, err)
		}
	}
	left, err := output(ipt, "-w", "-t", "nat", "-S", "CNI-HOSTPORT-DNAT")
	if err != nil || strings.Count(left, "\n-A ") > 0 || strings.HasPrefix(left, "-A ") {
		return errors.Join(append(errs, err)...)
	}
	// Nobody's hostPorts are left: the shared chains go too.
	for _, chain := range []string{"PREROUTING", "OUTPUT", "POSTROUTING"} {
		if _, err := deleteNATRules(ipt, chain, func(_, target string) bool {
			return strings.HasPrefix(target, "CNI-HOSTPORT-")
		}); err != nil {
			errs = append(errs, err)
		}
	}
	for _, chain := range portmapTopChains {
		if run(ipt, "-w", "-t", "nat", "-S", chain) != nil {
			continue
		}
		if err := run(ipt, "-w", "-t", "nat", "-F", chain); err != nil {
			errs = append(errs, err)
		}
		if err := run(ipt, "-w", "-t", "nat", "-X", chain); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// deleteNATRules deletes the rules of a nat chain of ipt (iptables or
// ip6tables) that match (given the rule's comment and its target) and
// returns the targets of those deleted. By rule number, last first, so
// that the numbers stay right.
func deleteNATRules(ipt, chain string, match func(comment, target string) bool) ([]string, error) {
	out, err := output(ipt, "-w", "-t", "nat", "-L", chain, "-n", "--line-numbers")
	if err != nil {
		return nil, err
	}
	var nums []int
	var targets []string
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Fields(line)
		num, err := strconv.Atoi(firstField(fields))
		if err != nil || len(fields) < 2 {
			continue // the header lines
		}
		comment := ""
		if i, j := strings.Index(line, "/* "), strings.LastIndex(line, " */"); i >= 0 && j > i {
			comment = line[i+3 : j]
		}
		if match(comment, fields[1]) {
			nums = append(nums, num)
			targets = append(targets, fields[1])
		}
	}
	var errs []error
	for i := len(nums) - 1; i >= 0; i-- {
		if err := run(ipt, "-w", "-t", "nat", "-D", chain, strconv.Itoa(nums[i])); err != nil {
			errs = append(errs, err)
		}
	}
	return targets, errors.Join(errs...)
}

func firstField(f []string) string {
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// cniCacheDir is libcni's cache (results of ADD, read by DEL), which
// containerd does not move: entries are named <network>-<container>-<if>.
const cniCacheDir = "/var/lib/cni/results"

// removeCNICache removes the node's entries from libcni's cache: its
// network's, and containerd's own loopback ones for the node's pods (their
// netns path is below dir).
func removeCNICache(network, dir string) error {
	entries, err := os.ReadDir(cniCacheDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(cniCacheDir, e.Name())
		ours := strings.HasPrefix(e.Name(), network+"-")
		if !ours {
			b, err := os.ReadFile(p)
			ours = err == nil && strings.Contains(string(b), `"`+dir+"/")
		}
		if ours {
			if err := os.Remove(p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// removeHostDirs removes the realNodeHostDirs the node made; from those the
// host had, only what is the node's: the kubelet's device-plugin socket and
// the links into the node's pod logs (below dir).
func removeHostDirs(made []string, dir string) error {
	var errs []error
	for _, d := range made {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	if !slices.Contains(made, "/var/lib/kubelet") {
		if err := os.Remove("/var/lib/kubelet/device-plugins/kubelet.sock"); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if !slices.Contains(made, "/var/log/containers") {
		entries, _ := os.ReadDir("/var/log/containers")
		for _, e := range entries {
			p := filepath.Join("/var/log/containers", e.Name())
			if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, dir+"/") {
				if err := os.Remove(p); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}
