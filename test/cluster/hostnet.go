package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
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

func (c *Cluster) setupHostNet() error {
	if c.state.Sysctls == nil {
		c.state.Sysctls = map[string]string{}
	}
	for key, val := range sysctls {
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
	_, err := os.Stat(KubeFirewallMarker)
	ours := err == nil
	c.state.KubeFirewallBefore = !ours && run("iptables", "-w", "-S", "KUBE-FIREWALL") == nil
	if !c.state.KubeFirewallBefore && !ours {
		if err := os.WriteFile(KubeFirewallMarker, []byte("KUBE-FIREWALL is made by a sockscale test cluster's kube-proxy\n"), 0o644); err != nil {
			return fmt.Errorf("mark KUBE-FIREWALL as ours: %w", err)
		}
	}
	// The forward guard first: nothing may be forwarded off the machine.
	if err := forwardGuard(); err != nil {
		return err
	}
	// Each bridge's MAC is set, from its address, as pods' are (podMAC):
	// a bridge without one takes its lowest port's, which changes as pods
	// come and go and leaves the pods' entries for their gateway stale.
	type link struct {
		name, addr string
		mac        netip.Addr
	}
	links := []link{{HostBridge, HostIP.String() + "/16", HostIP}, {ServiceBridge, "", ServiceCIDR.Addr().Next()}}
	for i := 0; i < c.opts.Nodes; i++ {
		links = append(links, link{NodeBridge(NodeName(i)), fmt.Sprintf("%s/%d", NodeIP(i), NodeCIDR(i).Bits()), NodeIP(i)})
	}
	for _, l := range links {
		if err := run("ip", "link", "add", l.name, "address", podMAC(l.mac), "type", "bridge"); err != nil {
			return err
		}
		if l.addr != "" {
			if err := run("ip", "addr", "add", l.addr, "dev", l.name); err != nil {
				return err
			}
		}
		if err := run("ip", "link", "set", l.name, "up"); err != nil {
			return err
		}
	}
	// Host-to-ClusterIP traffic leaves from HostIP, an address pods reach.
	if err := run("ip", "route", "add", ServiceCIDR.String(), "dev", ServiceBridge, "src", HostIP.String()); err != nil {
		return err
	}
	return c.checkRoutes()
}

// forwardGuard makes the chain ForwardChain, first in FORWARD: a forwarded
// packet with one side on our links and the other not is rejected, so pod
// traffic to an address that is not ours never leaves the machine (the
// default route leads off it), and nothing from outside reaches a pod.
func forwardGuard() error {
	if err := run("iptables", "-w", "-N", ForwardChain); err != nil {
		return err
	}
	rules := [][]string{
		{"-i", Prefix + "+", "!", "-o", Prefix + "+", "-j", "REJECT"},
		{"!", "-i", Prefix + "+", "-o", Prefix + "+", "-j", "DROP"},
	}
	for _, r := range rules {
		if err := run("iptables", append([]string{"-w", "-A", ForwardChain}, r...)...); err != nil {
			return err
		}
	}
	return run("iptables", "-w", "-I", "FORWARD", "1", "-m", "comment", "--comment", ClusterName, "-j", ForwardChain)
}

// checkRoutes refuses to go on unless every range the cluster uses is
// routed to one of our links.
func (c *Cluster) checkRoutes() error {
	probes := []string{HostIP.String(), "10.244.250.7", ServiceCIDR.Addr().Next().String(), "10.96.200.9"}
	for i := 0; i < c.opts.Nodes; i++ {
		probes = append(probes, NodeCIDR(i).Addr().Next().Next().String())
	}
	for _, ip := range probes {
		out, err := output("ip", "-j", "route", "get", ip)
		if err != nil {
			return err
		}
		var routes []struct {
			Dev  string `json:"dev"`
			Type string `json:"type"`
		}
		if err := json.Unmarshal([]byte(out), &routes); err != nil || len(routes) == 0 {
			return fmt.Errorf("route check: ip route get %s: %q", ip, out)
		}
		if r := routes[0]; r.Type != "local" && !strings.HasPrefix(r.Dev, Prefix) {
			return fmt.Errorf("route check: %s would leave through %s; refusing to start", ip, r.Dev)
		}
	}
	return nil
}

// teardownHostNet removes every netns, link and iptables rule of ours and
// restores the sysctls. Routes go with their links.
func teardownHostNet(st *state, kubeProxy string) error {
	var errs []error
	if out, err := output("ip", "netns", "list"); err == nil {
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], Prefix+"-") {
				if err := run("ip", "netns", "delete", f[0]); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	for _, l := range ourLinks() {
		// A pod's veth goes with its netns, asynchronously: gone is fine.
		if err := run("ip", "link", "delete", l); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
			errs = append(errs, err)
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
	// kubelet); it is ours to remove if the host had none before `up`.
	if st.Nodes > 0 && !st.KubeFirewallBefore {
		for _, chain := range []string{"INPUT", "OUTPUT"} {
			for run("iptables", "-w", "-D", chain, "-j", "KUBE-FIREWALL") == nil {
			}
		}
		if run("iptables", "-w", "-S", "KUBE-FIREWALL") == nil {
			_ = run("iptables", "-w", "-F", "KUBE-FIREWALL")
			if err := run("iptables", "-w", "-X", "KUBE-FIREWALL"); err != nil {
				errs = append(errs, err)
			}
		}
		if err := os.Remove(KubeFirewallMarker); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err)
		}
	}
	for run("iptables", "-w", "-D", "FORWARD", "-m", "comment", "--comment", ClusterName, "-j", ForwardChain) == nil {
	}
	if run("iptables", "-w", "-S", ForwardChain) == nil {
		if err := run("iptables", "-w", "-F", ForwardChain); err != nil {
			errs = append(errs, err)
		}
		if err := run("iptables", "-w", "-X", ForwardChain); err != nil {
			errs = append(errs, err)
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
func ourLinks() []string {
	out, err := output("ip", "-j", "link", "show")
	if err != nil {
		return nil
	}
	var links []struct {
		Name string `json:"ifname"`
	}
	_ = json.Unmarshal([]byte(out), &links)
	var ours []string
	for _, l := range links {
		if strings.HasPrefix(l.Name, Prefix) {
			ours = append(ours, l.Name)
		}
	}
	return ours
}
