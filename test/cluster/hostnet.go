package cluster

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sockscale/sockscale/internal/testutil/localroute"
	"github.com/sockscale/sockscale/internal/testutil/namedns"
)

// Host networking. Pods are on per-node bridges (one per simulated node, the
// node's IP is the bridge's and the pods' gateway); the host routes between
// the bridges, so pod-to-pod across nodes is one routed hop through the
// host's iptables. Bridged traffic within a node goes through iptables too
// (net.bridge.bridge-nf-call-iptables=1), so kube-proxy's DNAT and its
// reverse work for a pod that reaches a ClusterIP served on its own bridge.

// sysctls `up` sets; their old values are kept in the state file.
var sysctls = map[string]string{
	"net/ipv4/ip_forward": "1",
	// Absent without br_netfilter: then same-node ClusterIP traffic would
	// not be un-DNATed; up fails rather than run half-working.
	"net/bridge/bridge-nf-call-iptables": "1",
}

// sysctls6 are what a dual-stack cluster sets besides sysctls.
var sysctls6 = map[string]string{
	// Pods reach each other across nodes, and the host's IPv6 addresses on
	// other bridges, only through the host's routing. There is no
	// per-interface switch for it: IPv6 forwards a packet if its incoming
	// interface forwards, and conf/all is what sets them all. On eth0 too,
	// which keeps its addresses and static routes; a router's links drop
	// the routes router advertisements gave them and take no new ones
	// (accept_ra 1), so up refuses where there are such routes (see
	// ipv6ForwardingHarmless). ForwardChain's IPv6 twin keeps the host
	// from forwarding anything that is not ours (see forwardGuard).
	"net/ipv6/conf/all/forwarding": "1",
	// As bridge-nf-call-iptables, for kube-proxy's ip6tables rules.
	"net/bridge/bridge-nf-call-ip6tables": "1",
}

// sysctlsToSet is what up sets for c's options.
func (c *Cluster) sysctlsToSet() map[string]string {
	m := maps.Clone(sysctls)
	if c.opts.DualStack {
		maps.Copy(m, sysctls6)
	}
	return m
}

func (c *Cluster) setupHostNet() error {
	if c.state.Sysctls == nil {
		c.state.Sysctls = map[string]string{}
	}
	if c.opts.DualStack {
		if err := ipv6ForwardingHarmless(); err != nil {
			return err
		}
	}
	for key, val := range c.sysctlsToSet() {
		p := filepath.Join("/proc/sys", key)
		old, err := os.ReadFile(p)
		if err != nil {
			return fmt.Errorf("sysctl %s (is br_netfilter loaded?): %w", key, err)
		}
		if _, ok := c.state.Sysctls[key]; !ok {
			c.state.Sysctls[key] = strings.TrimSpace(string(old))
		}
		if err := c.state.save(c.opts.StateDir); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(val), 0); err != nil {
			return fmt.Errorf("sysctl %s=%s: %w", key, val, err)
		}
	}
	// A KUBE-FIREWALL chain is the host's own unless a cluster of ours
	// made it: the marker outlives a cluster that crashed before `down`
	// (whatever its state dir), so the next `down` removes its chain.
	// kube-proxy makes one in ip6tables too (its IPv6 proxier runs
	// whenever ip6tables works, dual-stack cluster or not): the marker
	// names the families whose chain is ours.
	made := kubeFirewallMarked()
	c.state.KubeFirewallBefore = !made["iptables"] && run("iptables", "-w", "-S", "KUBE-FIREWALL") == nil
	c.state.KubeFirewall6Before = !made["ip6tables"] && run("ip6tables", "-w", "-S", "KUBE-FIREWALL") == nil
	var ours []string
	for ipt, before := range map[string]bool{"iptables": c.state.KubeFirewallBefore, "ip6tables": c.state.KubeFirewall6Before} {
		if !before {
			ours = append(ours, ipt)
		}
	}
	if len(ours) > 0 {
		slices.Sort(ours)
		if err := os.WriteFile(KubeFirewallMarker, []byte(kubeFirewallMarkerText+strings.Join(ours, " ")+"\n"), 0o644); err != nil {
			return fmt.Errorf("mark KUBE-FIREWALL as ours: %w", err)
		}
	}
	// The forward guard first: nothing may be forwarded off the machine.
	if err := forwardGuard("iptables", false); err != nil {
		return err
	}
	if c.opts.DualStack {
		// Forwarding was off for IPv6 before (the state file has its old
		// value): the host forwards nothing of anybody else's either.
		if err := forwardGuard("ip6tables", c.state.Sysctls["net/ipv6/conf/all/forwarding"] == "0"); err != nil {
			return err
		}
	}
	// Each bridge's MAC is set, from its address, as pods' are (podMAC):
	// a bridge without one takes its lowest port's, which changes as pods
	// come and go and leaves the pods' entries for their gateway stale.
	type bridge struct {
		name        string
		addr, addr6 netip.Prefix // none for ServiceBridge; addr6 only if dual-stack
		mac         netip.Addr
	}
	bridges := []bridge{
		{HostBridge, netip.PrefixFrom(HostIP, ClusterCIDR.Bits()), netip.PrefixFrom(HostIP6, ClusterCIDR6.Bits()), HostIP},
		{ServiceBridge, netip.Prefix{}, netip.Prefix{}, ServiceCIDR.Addr().Next()},
	}
	for i := 0; i < c.opts.Nodes; i++ {
		bridges = append(bridges, bridge{NodeBridge(NodeName(i)), netip.PrefixFrom(NodeIP(i), NodeCIDR(i).Bits()),
			netip.PrefixFrom(NodeIP6(i), NodeCIDR6(i).Bits()), NodeIP(i)})
	}
	for _, b := range bridges {
		if !c.opts.DualStack {
			b.addr6 = netip.Prefix{}
		}
		if err := addBridge(b.name, podMAC(b.mac), b.addr, b.addr6); err != nil {
			return err
		}
	}
	// Host-to-ClusterIP traffic leaves from HostIP, an address pods reach.
	// Scope link, as `ip route add ... dev` gives a route without a gateway.
	svc, err := netlink.LinkByName(ServiceBridge)
	if err != nil {
		return fmt.Errorf("find link %s: %w", ServiceBridge, err)
	}
	route := &netlink.Route{LinkIndex: svc.Attrs().Index, Dst: ipNet(ServiceCIDR), Src: addrIP(HostIP), Scope: netlink.SCOPE_LINK}
	if err := netlink.RouteAdd(route); err != nil {
		return fmt.Errorf("add route %s dev %s src %s: %w", ServiceCIDR, ServiceBridge, HostIP, err)
	}
	if c.opts.DualStack {
		// Without it the IPv6 Service range would take the default route,
		// off the machine.
		route := &netlink.Route{LinkIndex: svc.Attrs().Index, Dst: ipNet(ServiceCIDR6), Src: addrIP(HostIP6), Scope: netlink.SCOPE_LINK}
		if err := netlink.RouteAdd(route); err != nil {
			return fmt.Errorf("add route %s dev %s src %s: %w", ServiceCIDR6, ServiceBridge, HostIP6, err)
		}
	}
	// The nodes' network namespace (the host's) under a name: an agent
	// cannot open /proc/1/ns/net on every machine (a PID 1 holding more
	// capabilities than the agent's root), as a node's agent would.
	if err := namedns.Attach(HostNetns, "/proc/self/ns/net"); err != nil {
		return err
	}
	return c.checkRoutes()
}

// ipv6ForwardingHarmless refuses IPv6 forwarding where turning it on would
// cost the host its own IPv6 routes: when forwarding goes on, the kernel
// removes the routes learned from router advertisements (a SLAAC host's
// default route). Nothing to check if forwarding is on already.
func ipv6ForwardingHarmless() error {
	if b, err := os.ReadFile("/proc/sys/net/ipv6/conf/all/forwarding"); err == nil && strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Protocol: unix.RTPROT_RA}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return fmt.Errorf("list IPv6 routes from router advertisements: %w", err)
	}
	if len(routes) > 0 {
		var rs []string
		for _, r := range routes {
			rs = append(rs, r.String())
		}
		return fmt.Errorf("dual-stack needs net.ipv6.conf.all.forwarding=1, which would remove the host's routes learned from router advertisements (%s); refusing to start", strings.Join(rs, "; "))
	}
	return nil
}

// kubeFirewallMarkerText starts KubeFirewallMarker's line; the families
// (iptables, ip6tables) whose chain is ours follow it.
const kubeFirewallMarkerText = "KUBE-FIREWALL is made by a sockscale test cluster's kube-proxy in: "

// kubeFirewallMarked says in which families KubeFirewallMarker marks
// KUBE-FIREWALL as ours. A marker without a list is of a cluster from
// before dual-stack: its chain was the iptables one.
func kubeFirewallMarked() map[string]bool {
	b, err := os.ReadFile(KubeFirewallMarker)
	if err != nil {
		return nil
	}
	_, list, ok := strings.Cut(strings.TrimSpace(string(b)), " in: ")
	if !ok {
		return map[string]bool{"iptables": true}
	}
	m := map[string]bool{}
	for _, ipt := range strings.Fields(list) {
		m[ipt] = true
	}
	return m
}

// addBridge makes bridge name with MAC mac and those of addrs that are
// valid, up.
func addBridge(name string, mac net.HardwareAddr, addrs ...netip.Prefix) error {
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, HardwareAddr: mac}}
	if err := netlink.LinkAdd(br); err != nil {
		return fmt.Errorf("add bridge %s: %w", name, err)
	}
	for _, a := range addrs {
		if a.IsValid() {
			if err := addAddr(netlink.AddrAdd, br, a); err != nil {
				return fmt.Errorf("add address %s to %s: %w", a, name, err)
			}
		}
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	return nil
}

// addAddr adds a to link through add (netlink.AddrAdd or a handle's in
// another netns). An IPv6 address gets nodad: duplicate address detection
// would keep it tentative, unusable, for a second or more (forever on a
// bridge without ports, which has no carrier), and every address here is
// given out by us alone.
func addAddr(add func(netlink.Link, *netlink.Addr) error, link netlink.Link, a netip.Prefix) error {
	na := &netlink.Addr{IPNet: ipNet(a)}
	if a.Addr().Is6() {
		na.Flags = unix.IFA_F_NODAD
	}
	return add(link, na)
}

// addrIP is a as a net.IP (4 bytes for IPv4), for netlink.
func addrIP(a netip.Addr) net.IP { return net.IP(a.AsSlice()) }

// ipNet is p as a net.IPNet, for netlink: an interface's address and its
// subnet's length, or (masked) a route's destination.
func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: addrIP(p.Addr()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// forwardGuard makes the chain ForwardChain with ipt (iptables or
// ip6tables), first in FORWARD: a forwarded packet with one side on our
// links and the other not is rejected, so pod traffic to an address that is
// not ours never leaves the machine (the default route leads off it), and
// nothing from outside reaches a pod. onlyOurs drops the forwarding of
// packets that touch none of our links as well: for a family whose
// forwarding was off before up turned it on.
func forwardGuard(ipt string, onlyOurs bool) error {
	if err := run(ipt, "-w", "-N", ForwardChain); err != nil {
		return err
	}
	rules := [][]string{
		{"-i", Prefix + "+", "!", "-o", Prefix + "+", "-j", "REJECT"},
		{"!", "-i", Prefix + "+", "-o", Prefix + "+", "-j", "DROP"},
	}
	if onlyOurs {
		rules = append(rules, []string{"!", "-i", Prefix + "+", "!", "-o", Prefix + "+", "-j", "DROP"})
	}
	for _, r := range rules {
		if err := run(ipt, append([]string{"-w", "-A", ForwardChain}, r...)...); err != nil {
			return err
		}
	}
	return run(ipt, "-w", "-I", "FORWARD", "1", "-m", "comment", "--comment", ClusterName, "-j", ForwardChain)
}

// checkRoutes refuses to go on unless every range the cluster uses is
// routed to one of our links (or is a local address, as HostIP is).
func (c *Cluster) checkRoutes() error {
	probes := []netip.Addr{HostIP, netip.MustParseAddr("10.244.250.7"), ServiceCIDR.Addr().Next(), netip.MustParseAddr("10.96.200.9")}
	for i := 0; i < c.opts.Nodes; i++ {
		probes = append(probes, NodeCIDR(i).Addr().Next().Next())
	}
	if c.opts.DualStack {
		probes = append(probes, HostIP6, netip.MustParseAddr("fd5c:a1e:0:fa::7"), ServiceCIDR6.Addr().Next(), netip.MustParseAddr("fd5c:a1e:96::c809"))
		for i := 0; i < c.opts.Nodes; i++ {
			probes = append(probes, NodeCIDR6(i).Addr().Next().Next())
		}
	}
	for _, ip := range probes {
		if err := localroute.Check(ip, localroute.Local(), localroute.DevPrefix(Prefix)); err != nil {
			return fmt.Errorf("route check: %w; refusing to start", err)
		}
	}
	return nil
}

// teardownHostNet removes every netns, link and iptables rule of ours and
// restores the sysctls. Routes go with their links.
func teardownHostNet(st *state, kubeProxy string) error {
	var errs []error
	if names, err := namedns.List(); err != nil {
		errs = append(errs, err)
	} else {
		for _, name := range names {
			// One the simulator removed since the listing is gone: fine.
			if strings.HasPrefix(name, Prefix+"-") {
				if err := namedns.Delete(name); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, err)
				}
			}
		}
	}
	links, err := ourLinks()
	if err != nil {
		errs = append(errs, err)
	}
	for _, l := range links {
		// A pod's veth goes with its netns, asynchronously: gone is fine.
		if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			errs = append(errs, fmt.Errorf("delete link %s: %w", l.Attrs().Name, err))
		}
	}
	// kube-proxy removes its own KUBE-* chains.
	if kubeProxy != "" {
		if _, err := os.Stat(kubeProxy); err == nil {
			if err := run(kubeProxy, "--cleanup", "--proxy-mode=iptables"); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// kube-proxy's --cleanup leaves KUBE-FIREWALL (it shares it with the
	// kubelet), in both families; each is ours to remove if the host had
	// none of that family before `up`.
	if st.Nodes > 0 {
		for ipt, before := range map[string]bool{"iptables": st.KubeFirewallBefore, "ip6tables": st.KubeFirewall6Before} {
			if before {
				continue
			}
			for _, chain := range []string{"INPUT", "OUTPUT"} {
				for run(ipt, "-w", "-D", chain, "-j", "KUBE-FIREWALL") == nil {
				}
			}
			if run(ipt, "-w", "-S", "KUBE-FIREWALL") == nil {
				_ = run(ipt, "-w", "-F", "KUBE-FIREWALL")
				if err := run(ipt, "-w", "-X", "KUBE-FIREWALL"); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if err := os.Remove(KubeFirewallMarker); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	// Both families whatever the options: a dual-stack cluster's guard
	// goes even if the next `down` is run without the option.
	for _, ipt := range []string{"iptables", "ip6tables"} {
		for run(ipt, "-w", "-D", "FORWARD", "-m", "comment", "--comment", ClusterName, "-j", ForwardChain) == nil {
		}
		if run(ipt, "-w", "-S", ForwardChain) == nil {
			if err := run(ipt, "-w", "-F", ForwardChain); err != nil {
				errs = append(errs, err)
			}
			if err := run(ipt, "-w", "-X", ForwardChain); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for key, val := range st.Sysctls {
		if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(val), 0); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", key, val, err))
		}
	}
	return errors.Join(errs...)
}

// ourLinks lists the host's links named with Prefix.
func ourLinks() ([]netlink.Link, error) {
	var links []netlink.Link
	var err error
	// A dump that links changed under (pods come and go) is retried.
	for range 5 {
		if links, err = netlink.LinkList(); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var ours []netlink.Link
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, Prefix) {
			ours = append(ours, l)
		}
	}
	return ours, nil
}
