package cgroup2

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Root returns where the cgroup v2 hierarchy is mounted: /sys/fs/cgroup on
// most nodes, /sys/fs/cgroup/unified on hybrid (v1 + v2) layouts.
func Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		// ... mount-point ... - fstype source options
		fields := strings.Fields(s.Text())
		for i, f := range fields {
			if f == "-" && i+1 < len(fields) && fields[i+1] == "cgroup2" && len(fields) > 4 {
				return fields[4], nil
			}
		}
	}
	if err := s.Err(); err != nil {
		return "", fmt.Errorf("read mounts: %w", err)
	}
	return "", errors.New("no cgroup2 file system is mounted")
}

// Own returns the directory of the cgroup v2 this process is in, under
// Root: where a test that moves itself elsewhere goes back to.
func Own() (string, error) {
	root, err := Root()
	if err != nil {
		return "", err
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("read own cgroup: %w", err)
	}
	for _, line := range strings.Split(string(own), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			return filepath.Join(root, rest), nil
		}
	}
	return "", fmt.Errorf("no cgroup v2 line in /proc/self/cgroup:\n%s", own)
}
