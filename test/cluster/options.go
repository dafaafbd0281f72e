package cluster

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

// Names and ranges. Every link, netns, cgroup, bpffs directory and iptables
// chain the cluster makes carries Prefix, so `down` (and an `up` after a
// crash) finds and removes them all.
const (
	Prefix = "sccl"
	// ClusterName names the cgroup subtree and the bpffs directory.
	ClusterName = "sockscale-cluster"
	// HostNetns names the nodes' network namespace (the host's) under
	// /var/run/netns: the agents' chart value agent.nodeNetns.
	HostNetns = Prefix + "-host"

	// HostBridge has no ports: it carries HostIP (the apiserver's and the
	// DNS's address, reachable from every pod through its gateway) and, with
	// its /16, a local route for every address of ClusterCIDR that is no node's.
	HostBridge = Prefix + "-host"
	// ServiceBridge has no ports: it only gives ServiceCIDR a local route, so
	// an unassigned ClusterIP times out here instead of leaving the machine.
	ServiceBridge = Prefix + "-svc"
	// ForwardChain keeps forwarded pod traffic on the machine (see hostnet.go).
	ForwardChain = "SCCL-FORWARD"

	APIServerPort = 6443
	// RegistryAddr is the cluster's OCI registry (plain HTTP, loopback
	// only): the node simulator pulls every pod's image from it, so push
	// images to RegistryAddr/<path>/<name>:<tag>.
	RegistryAddr  = "127.0.0.1:12390"
	EtcdPort      = 12379
	EtcdPeerPort  = 12380
	DNSPort       = 53
	ClusterDomain = "cluster.local"
)

var (
	// ClusterCIDR holds HostIP and every node's pod CIDR (10.244.<i+1>.0/24).
	ClusterCIDR = netip.MustParsePrefix("10.244.0.0/16")
	// HostIP is the host's address on HostBridge: the apiserver's, the
	// cluster DNS's, and the source of host traffic to ClusterIPs.
	HostIP = netip.MustParseAddr("10.244.0.1")
	// ServiceCIDR is the apiserver's --service-cluster-ip-range.
	ServiceCIDR = netip.MustParsePrefix("10.96.0.0/16")
	// KubernetesServiceIP is the first address of ServiceCIDR, as the
	// apiserver allocates it.
	KubernetesServiceIP = netip.MustParseAddr("10.96.0.1")

	// The IPv6 ranges of a dual-stack cluster (Options.DualStack), each
	// beside its IPv4 twin above. Unique local addresses (fd00::/8), so
	// nothing of them is routed anywhere but here; `up` gives each a local
	// route before anything is sent to it.

	// ClusterCIDR6 holds HostIP6 and every node's IPv6 pod CIDR
	// (fd5c:a1e:0:<i+1>::/64).
	ClusterCIDR6 = netip.MustParsePrefix("fd5c:a1e::/56")
	// HostIP6 is the host's IPv6 address on HostBridge: the cluster DNS's
	// too, and the source of host traffic to IPv6 ClusterIPs.
	HostIP6 = netip.MustParseAddr("fd5c:a1e::1")
	// ServiceCIDR6 is the apiserver's second --service-cluster-ip-range.
	ServiceCIDR6 = netip.MustParsePrefix("fd5c:a1e:96::/112")
)

// Options says what cluster to run.
type Options struct {
	// Nodes is the number of simulated nodes (node-a, node-b, ...).
	Nodes int
	// RealNodes is the number of real nodes (real-a, ...): a kubelet,
	// containerd, runc and the CNI plugins each (make real-node-binaries),
	// joined to the cluster beside the simulated ones. See realnode_join.go
	// for what tells them apart (a taint, a label).
	RealNodes int
	// StateDir keeps certificates, kubeconfigs, logs, etcd's data and the
	// state file of what runs.
	StateDir string
	// KubeBinDir holds etcd, kube-apiserver, kube-controller-manager,
	// kube-scheduler, kube-proxy, kubectl and coredns (make cluster-binaries).
	KubeBinDir string
	// Self is the sockscale-cluster binary: it runs the node simulator and is
	// the helper every container starts through. Empty: this process's own
	// binary if it is sockscale-cluster, else built with `go build`.
	Self string
	// DualStack runs the cluster dual-stack, IPv4 primary and IPv6
	// secondary (RFC 4193 ranges: ClusterCIDR6, ServiceCIDR6, NodeCIDR6):
	// two Service ranges, nodes with both pod CIDRs and addresses, pods
	// with both podIPs (IPv4 first), kube-proxy's rules in ip6tables too.
	// It turns on IPv6 forwarding on the host while the cluster runs.
	DualStack bool
}

// DefaultStateDir is ~/.cache/sockscale/cluster.
func DefaultStateDir() string {
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "sockscale", "cluster")
}

// DefaultKubeBinDir is $SOCKSCALE_CLUSTER_BINARIES, else where
// `make cluster-binaries` links them.
func DefaultKubeBinDir() string {
	if d := os.Getenv("SOCKSCALE_CLUSTER_BINARIES"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "sockscale", "cluster-bin")
}

func (o *Options) defaults() error {
	if o.Nodes == 0 {
		o.Nodes = 2
	}
	if o.Nodes < 1 || o.Nodes > 26 {
		return fmt.Errorf("nodes: %d, want 1..26", o.Nodes)
	}
	if o.RealNodes < 0 || o.RealNodes > maxRealNodes {
		return fmt.Errorf("real nodes: %d, want 0..%d", o.RealNodes, maxRealNodes)
	}
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir()
	}
	if o.KubeBinDir == "" {
		o.KubeBinDir = DefaultKubeBinDir()
	}
	var err error
	for _, p := range []*string{&o.StateDir, &o.KubeBinDir} {
		if *p != "" {
			if *p, err = filepath.Abs(*p); err != nil {
				return err
			}
		}
	}
	return nil
}

// NodeName is the name of node i: node-a, node-b, ...
func NodeName(i int) string { return "node-" + string(rune('a'+i)) }

// NodeIndex is the inverse of NodeName, -1 if name is none of ours.
func NodeIndex(name string) int {
	if len(name) != 6 || !strings.HasPrefix(name, "node-") || name[5] < 'a' || name[5] > 'z' {
		return -1
	}
	return int(name[5] - 'a')
}

// NodeCIDR is node i's pod CIDR, 10.244.<i+1>.0/24.
func NodeCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i + 1), 0}), 24)
}

// NodeIP is node i's address: its bridge's, the pods' gateway. It is the
// Node's InternalIP and the podIP of its hostNetwork pods.
func NodeIP(i int) netip.Addr { return NodeCIDR(i).Addr().Next() }

// NodeCIDR6 is node i's IPv6 pod CIDR, fd5c:a1e:0:<i+1>::/64.
func NodeCIDR6(i int) netip.Prefix {
	a := ClusterCIDR6.Addr().As16()
	a[7] = byte(i + 1)
	return netip.PrefixFrom(netip.AddrFrom16(a), 64)
}

// NodeIP6 is node i's IPv6 address (its bridge's, the pods' IPv6
// gateway): the Node's second InternalIP in a dual-stack cluster.
func NodeIP6(i int) netip.Addr { return NodeCIDR6(i).Addr().Next() }

// PodIP6 is the IPv6 address of the pod whose IPv4 address on node i is
// ip4: the same host part in NodeCIDR6(i), so the pod's MAC, derived from
// ip4, stays right for both (see podMAC).
func PodIP6(i int, ip4 netip.Addr) netip.Addr {
	a := NodeCIDR6(i).Addr().As16()
	a[15] = ip4.As4()[3]
	return netip.AddrFrom16(a)
}

// NodeBridge is node i's bridge, its pods' veths are its ports.
func NodeBridge(node string) string { return Prefix + "-" + node }
