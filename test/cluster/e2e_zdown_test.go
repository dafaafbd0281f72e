package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestE2EZDown runs last (files and tests run in name order): it stops the
// shared cluster and checks that nothing of it is left on the host.
func TestE2EZDown(t *testing.T) {
	c := startCluster(t)
	if err := c.Down(); err != nil {
		t.Fatalf("down: %v", err)
	}
	e2eDown = true
	if links := ourLinks(); len(links) > 0 {
		t.Errorf("links left: %v", links)
	}
	if out, _ := output("ip", "netns", "list"); strings.Contains(out, Prefix) {
		t.Errorf("netns left: %s", out)
	}
	if out, _ := output("ip", "route", "show"); strings.Contains(out, "10.244.") || strings.Contains(out, "10.96.") {
		t.Errorf("routes left:\n%s", out)
	}
	for _, table := range []string{"filter", "nat", "mangle"} {
		out, err := output("iptables", "-w", "-t", table, "-S")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "KUBE-") || strings.Contains(out, ForwardChain) {
			t.Errorf("iptables %s still has our chains:\n%s", table, out)
		}
	}
	for _, dir := range []string{filepath.Join(c.cgroupRoot, ClusterName), filepath.Join("/sys/fs/bpf", ClusterName)} {
		if _, err := os.Stat(dir); err == nil {
			t.Errorf("%s left", dir)
		}
	}
	for _, p := range c.state.Processes {
		if p.alive() {
			t.Errorf("process %s (%d) still runs", p.Name, p.PID)
		}
	}
	if _, err := os.Stat(statePath(c.StateDir())); err == nil {
		t.Error("state file left")
	}
}
