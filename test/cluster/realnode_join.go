package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockscale/sockscale/internal/imagebuild"
	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
)

// Real nodes joined to the cluster (Options.RealNodes). Each is a
// RealNode (realnode.go) whose kubelet registers with the API server as
// system:node:<name>, like a kubeadm node, beside the simulated nodes:
//
//   - pod CIDR 10.244.(100+i).0/24 on its own bridge, whose address is the
//     node's IP; its pods route the cluster's and the Services' ranges
//     through it and nothing else;
//   - its cgroup is <cgroup root>/sockscale-cluster/<name> in every
//     hierarchy (the kubelet's cgroupRoot; pods below kubepods there), so
//     `down` finds it with the simulated nodes';
//   - tainted RealNodeTaint:NoSchedule, so only the pods that ask for a
//     real kubelet run there, and labelled AgentPoolLabel=<name>: its
//     agent needs its own cgroup root (RealNodeAgentValues).

// maxRealNodes bounds Options.RealNodes (pod CIDRs 10.244.100-103.0/24).
const maxRealNodes = 4

const (
	// RealNodeTaint (value "true", NoSchedule) is on every real node.
	RealNodeTaint = "sockscale.dev/real-node"
	// AgentPoolLabel is the chart's node label for agent.pools: the nodes
	// whose agent runs with the pool's settings.
	AgentPoolLabel = "sockscale.dev/agent-pool"
	// realNodeHealthzPort is real node 0's kubelet healthz port on
	// 127.0.0.1 (node i's: +i); not 10248, which a kubelet of the host
	// may hold.
	realNodeHealthzPort = 12448
)

// RealNodeName is the name of real node i: real-a, real-b, ...
func RealNodeName(i int) string { return "real-" + string(rune('a'+i)) }

// RealNodeCIDR is real node i's pod CIDR, 10.244.(100+i).0/24.
func RealNodeCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(100 + i), 0}), 24)
}

// RealNodeIP is real node i's address: its bridge's, its InternalIP.
func RealNodeIP(i int) netip.Addr { return RealNodeCIDR(i).Addr().Next() }

// RealNodeCIDR6 is real node i's IPv6 pod CIDR in a dual-stack cluster,
// fd5c:a1e:0:<0x64+i>::/64 (0x64 = 100, as in RealNodeCIDR).
func RealNodeCIDR6(i int) netip.Prefix {
	a := ClusterCIDR6.Addr().As16()
	a[7] = byte(100 + i)
	return netip.PrefixFrom(netip.AddrFrom16(a), 64)
}

// RealNodeIP6 is real node i's IPv6 address: its bridge's, its second
// InternalIP.
func RealNodeIP6(i int) netip.Addr { return RealNodeCIDR6(i).Addr().Next() }

// RealNodes is the number of real nodes, named RealNodeName(0..n-1).
func (c *Cluster) RealNodes() int { return c.opts.RealNodes }

// RealNodeAgentValues are the sockscale chart's values for the agent pool
// of real node name (agent.pools.<name>.<key>): its cgroup root is the
// node's own cgroup, where the kubelet puts its pods, not the host's
// (whose programs would see every process of the machine, the tests' own
// clients too); its bpffs directory is the node's, which `down` removes.
func RealNodeAgentValues(name string) (map[string]string, error) {
	v2, err := cgroup2.Root()
	if err != nil {
		return nil, err
	}
	return map[string]string{
		"cgroupRoot":     nodeCgroup(v2, name),
		"bpffs.hostPath": nodeBPFFS(name),
	}, nil
}

// addRealNodeIdentities gives each real node's kubelet a token; before
// the API server starts, which reads them once.
func (c *Cluster) addRealNodeIdentities(pkiDir string) error {
	for i := range c.opts.RealNodes {
		if err := addIdentity(pkiDir, nodeIdentity(RealNodeName(i))); err != nil {
			return err
		}
	}
	return nil
}

// startRealNodes registers and starts the real nodes; the caller waits
// for them to be Ready with the simulated ones.
func (c *Cluster) startRealNodes(ctx context.Context) error {
	if c.opts.RealNodes == 0 {
		return nil
	}
	pkiDir := filepath.Join(c.opts.StateDir, "pki")
	sandbox, err := pushSandboxImage(ctx)
	if err != nil {
		return fmt.Errorf("real nodes' sandbox image: %w", err)
	}
	for i := range c.opts.RealNodes {
		name := RealNodeName(i)
		id := nodeIdentity(name)
		tok, err := tokenOf(pkiDir, id.user)
		if err != nil {
			return err
		}
		kc, err := writeKubeconfig(pkiDir, name, tok)
		if err != nil {
			return err
		}
		if err := c.registerRealNode(ctx, i); err != nil {
			return err
		}
		if err := os.MkdirAll(nodeBPFFS(name), 0o755); err != nil {
			return err
		}
		var cidr6 netip.Prefix
		routes := []netip.Prefix{ClusterCIDR, ServiceCIDR}
		if c.opts.DualStack {
			cidr6 = RealNodeCIDR6(i)
			routes = append(routes, ClusterCIDR6, ServiceCIDR6)
		}
		if _, err := StartRealNode(ctx, RealNodeOptions{
			Name: name, Dir: RealNodeDir(c.opts.StateDir, name), BinDir: c.opts.KubeBinDir,
			PodCIDR: RealNodeCIDR(i), PodCIDR6: cidr6, PodRoutes: routes,
			Bridge: NodeBridge(name), SandboxImage: sandbox, PlainHTTPRegistries: []string{RegistryAddr},
			CgroupParent: ClusterName + "/" + name,
			Kubeconfig:   kc, ClientCAFile: filepath.Join(pkiDir, "ca.crt"),
			ClusterDNS:  []netip.Addr{HostIP},
			HealthzPort: realNodeHealthzPort + i,
		}); err != nil {
			return err
		}
	}
	return nil
}

// registerRealNode makes real node i's Node before its kubelet starts, so
// that it is tainted and has its pod CIDR before anything is scheduled
// there (the kubelet adopts an existing Node and keeps both).
func (c *Cluster) registerRealNode(ctx context.Context, i int) error {
	name := RealNodeName(i)
	cidr := RealNodeCIDR(i).String()
	cidrs := []string{cidr}
	if c.opts.DualStack {
		cidrs = append(cidrs, RealNodeCIDR6(i).String())
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", AgentPoolLabel: name,
		}},
		Spec: corev1.NodeSpec{
			PodCIDR: cidr, PodCIDRs: cidrs,
			Taints: []corev1.Taint{{Key: RealNodeTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}},
		},
	}
	_, err := c.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("node %s exists already in a new cluster's API", name)
	}
	return err
}

// sandboxRepo holds the real nodes' pause image in the cluster's registry.
const sandboxRepo = RegistryAddr + "/" + ClusterName

// pushSandboxImage builds the project's pause image and pushes it to the
// cluster's registry, which a new cluster starts empty; it returns its
// reference.
func pushSandboxImage(ctx context.Context) (string, error) {
	dir, err := moduleDir(ctx)
	if err != nil {
		return "", err
	}
	epoch, err := imagebuild.SourceDateEpoch(ctx, dir)
	if err != nil {
		return "", err
	}
	var specs []imagebuild.Spec
	for _, s := range imagebuild.Images {
		if s.Name == "pause" {
			specs = append(specs, s)
		}
	}
	if len(specs) != 1 {
		return "", errors.New("imagebuild has no pause image")
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	built, err := imagebuild.Build(ctx, imagebuild.Options{Dir: dir, Epoch: epoch}, specs)
	if err != nil {
		return "", err
	}
	const tag = "node"
	if _, err := imagebuild.Push(ctx, built, sandboxRepo, tag); err != nil {
		return "", err
	}
	return sandboxRepo + "/pause:" + tag, nil
}

// moduleDir is the sockscale module's directory (the images' sources),
// found by the go command from the working directory.
func moduleDir(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("real nodes build their pause image from the sockscale module: run from inside it")
	}
	return filepath.Dir(mod), nil
}

// isRealNode says whether name is a real node's (RealNodeName).
func isRealNode(name string) bool {
	for i := range maxRealNodes {
		if name == RealNodeName(i) {
			return true
		}
	}
	return false
}

// realPodSandbox is PodSandbox for a pod on a real node: the cgroup the
// kubelet and runc made for its first container (cgroupfs driver, below
// the node's cgroup: kubepods[/<qos>]/pod<uid>/<container id>) and that
// container's network namespace.
func realPodSandbox(pod *corev1.Pod) (netns, cgroup string, err error) {
	if len(pod.Status.ContainerStatuses) == 0 || pod.Status.ContainerStatuses[0].State.Running == nil {
		return "", "", fmt.Errorf("pod %s/%s: its first container does not run yet", pod.Namespace, pod.Name)
	}
	id, ok := strings.CutPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	if !ok {
		return "", "", fmt.Errorf("pod %s/%s: container ID %q is not containerd's", pod.Namespace, pod.Name, pod.Status.ContainerStatuses[0].ContainerID)
	}
	v2, err := cgroup2.Root()
	if err != nil {
		return "", "", err
	}
	dir := filepath.Join(nodeCgroup(v2, pod.Spec.NodeName), "kubepods")
	switch pod.Status.QOSClass {
	case corev1.PodQOSBestEffort, corev1.PodQOSBurstable:
		dir = filepath.Join(dir, strings.ToLower(string(pod.Status.QOSClass)))
	case corev1.PodQOSGuaranteed:
	default:
		return "", "", fmt.Errorf("pod %s/%s: no QoS class yet", pod.Namespace, pod.Name)
	}
	cgroup = filepath.Join(dir, "pod"+string(pod.UID), id)
	b, err := os.ReadFile(filepath.Join(cgroup, "cgroup.procs"))
	if err != nil {
		return "", "", err
	}
	pid, _, _ := strings.Cut(string(b), "\n")
	if pid == "" {
		return "", "", fmt.Errorf("pod %s/%s: no process in %s", pod.Namespace, pod.Name, cgroup)
	}
	if pod.Spec.HostNetwork {
		return "", cgroup, nil
	}
	netns = podNetNS(pod.Spec.NodeName, pod)
	if _, err := os.Stat(filepath.Join("/run/netns", netns)); errors.Is(err, os.ErrNotExist) {
		if out, err := exec.Command("ip", "netns", "attach", netns, pid).CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("ip netns attach %s %s: %w: %s", netns, pid, err, out)
		}
	}
	return netns, cgroup, nil
}
