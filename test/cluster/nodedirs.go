package cluster

// NodeCgroup is node's cgroup v2 subtree: what a pod's hostPath of the
// host's cgroup root is on that node, so where its agent attaches.
func (c *Cluster) NodeCgroup(node string) string { return nodeCgroup(c.cgroupRoot, node) }

// NodeBPFFS is node's directory in the host's bpffs: what a pod's hostPath
// /sys/fs/bpf is on that node, so where its agent's pin directory lives.
func (c *Cluster) NodeBPFFS(node string) string { return nodeBPFFS(node) }

// Nodes is the number of simulated nodes, named NodeName(0..Nodes-1).
func (c *Cluster) Nodes() int { return c.opts.Nodes }
