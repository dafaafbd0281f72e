package cluster

// NodeCgroup is node's cgroup v2 subtree: what a pod's hostPath of the
// host's cgroup root is on that node, so where its agent attaches.
func (c *Cluster) NodeCgroup(node string) string { return nodeCgroup(c.cgroupRoot, node) }

// NodeBPFFS is node's directory in the host's bpffs: what a pod's hostPath
// /sys/fs/bpf is on that node, so where its agent's pin directory lives.
func (c *Cluster) NodeBPFFS(node string) string { return nodeBPFFS(node) }

// Nodes is the number of simulated nodes, named NodeName(0..Nodes-1).
func (c *Cluster) Nodes() int { return c.opts.Nodes }

// NodeNames are every node's name: the simulated ones', then the real
// ones'. NodeCgroup and NodeBPFFS hold for both: a real node's kubelet
// puts its pods below its NodeCgroup, and its agent pool pins in its
// NodeBPFFS (RealNodeAgentValues).
func (c *Cluster) NodeNames() []string {
	var names []string
	for i := range c.opts.Nodes {
		names = append(names, NodeName(i))
	}
	for i := range c.opts.RealNodes {
		names = append(names, RealNodeName(i))
	}
	return names
}
