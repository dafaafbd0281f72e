// Package memlimit sets the Go runtime's soft memory limit from the
// container's cgroup memory limit, so the garbage collector works harder
// as the heap nears the limit instead of the kernel killing the process:
// with the default GOGC=100 a heap of live size L grows to about 2L
// before a collection, and a controller sized for L is OOM-killed.
package memlimit

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
)

// Fraction of the cgroup's limit given to the Go runtime: the rest is for
// what it does not count (thread stacks, the binary, page cache the
// kernel charges to the container).
const Fraction = 0.9

// Set applies Fraction of the memory limit of this process's cgroup as
// the runtime's soft limit and returns it (0 and no error when there is
// nothing to apply). GOMEMLIMIT in the environment wins: then Set does
// nothing. cgroupFS is where the cgroup v2 hierarchy is mounted
// ("/sys/fs/cgroup" in a container); selfCgroup is /proc/self/cgroup.
func Set(cgroupFS, selfCgroup string) (int64, error) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0, nil
	}
	limit, err := CgroupLimit(cgroupFS, selfCgroup)
	if err != nil || limit == 0 {
		return 0, err
	}
	soft := int64(float64(limit) * Fraction)
	debug.SetMemoryLimit(soft)
	return soft, nil
}

// CgroupLimit reads memory.max of this process's cgroup v2 (its path from
// selfCgroup, under cgroupFS; with a cgroup namespace that is cgroupFS
// itself). It returns 0 when the cgroup has no limit ("max") or there is
// no cgroup v2 file to read (cgroup v1, not in a container): nothing to
// apply, not an error. A file that is there but unreadable is an error.
func CgroupLimit(cgroupFS, selfCgroup string) (int64, error) {
	candidates := []string{filepath.Join(cgroupFS, "memory.max")}
	if data, err := os.ReadFile(selfCgroup); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			if path, ok := strings.CutPrefix(sc.Text(), "0::"); ok && path != "/" {
				candidates = append([]string{filepath.Join(cgroupFS, path, "memory.max")}, candidates...)
			}
		}
	}
	for _, file := range candidates {
		data, err := os.ReadFile(file)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("memory limit: %w", err)
		}
		v := strings.TrimSpace(string(data))
		if v == "max" {
			return 0, nil
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 || n == math.MaxInt64 {
			return 0, fmt.Errorf("memory limit: %s holds %q, want a positive byte count or \"max\"", file, v)
		}
		return n, nil
	}
	return 0, nil
}
