package cluster

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/sockscale/sockscale/internal/testutil/namedns"
)

// TestE2EZDown runs after the other tests of the shared cluster (files and
// tests run in name order; only TestE2EZDualStack, with a cluster of its
// own, comes later): it stops the shared cluster and checks that nothing
// of it is left on the host.
func TestE2EZDown(t *testing.T) {
	c := startCluster(t)
	if err := c.Down(); err != nil {
		t.Fatalf("down: %v", err)
	}
	e2eDown = true
	links, err := ourLinks()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		t.Errorf("link left: %s", l.Attrs().Name)
	}
	names, err := namedns.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if strings.Contains(name, Prefix) {
			t.Errorf("netns left: %s", name)
		}
	}
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if routeInRanges(r, ClusterCIDR, ServiceCIDR) {
			t.Errorf("route left: %s", r)
		}
	}
	// kube-proxy's rules go in both families; a KUBE-FIREWALL the host
	// had before stays.
	for ipt, before := range map[string]bool{"iptables": c.state.KubeFirewallBefore, "ip6tables": c.state.KubeFirewall6Before} {
		for _, table := range []string{"filter", "nat", "mangle"} {
			out, err := output(ipt, "-w", "-t", table, "-S")
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range strings.Split(out, "\n") {
				if before && strings.Contains(line, "KUBE-FIREWALL") {
					continue
				}
				if strings.Contains(line, "KUBE-") || strings.Contains(line, ForwardChain) {
					t.Errorf("%s -t %s still has our rule: %s", ipt, table, line)
				}
			}
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

// routeInRanges says r's destination, source or gateway is an address of
// one of ranges.
func routeInRanges(r netlink.Route, ranges ...netip.Prefix) bool {
	ips := []net.IP{r.Src, r.Gw}
	if r.Dst != nil {
		ips = append(ips, r.Dst.IP)
	}
	for _, ip := range ips {
		a, ok := netip.AddrFromSlice(ip)
		for _, p := range ranges {
			if ok && p.Contains(a.Unmap()) {
				return true
			}
		}
	}
	return false
}
