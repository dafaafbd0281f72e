package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
)

// Cluster is a running local cluster.
type Cluster struct {
	opts  Options
	state *state
	// cgroupRoot is the host's cgroup v2 mount; cgroupDir our subtree in it.
	cgroupRoot, cgroupDir string
	// lock is held from Up to Down (see lockHost).
	lock *os.File
	// phaseStart is when up began (see phase).
	phaseStart time.Time

	// Kubeconfig is the path of a cluster-admin kubeconfig.
	Kubeconfig string
	// Config is Kubeconfig's REST config.
	Config *rest.Config
	// Client is a cluster-admin clientset.
	Client kubernetes.Interface
	// UpTime is how long Up took (binaries built, cleanup of a previous
	// cluster not counted).
	UpTime time.Duration
}

// binaries of the control plane, all in Options.KubeBinDir.
var kubeBinaries = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "kubectl", "coredns"}

// Up starts a cluster after removing whatever a previous one in the same
// state dir left (processes, links, netns, rules, cgroups, pins). It needs
// root. On error it leaves what it started for Down (and the logs).
func Up(ctx context.Context, opts Options) (*Cluster, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the local cluster needs root (network namespaces, bridges, iptables, cgroups)")
	}
	for _, b := range kubeBinaries {
		if _, err := os.Stat(filepath.Join(opts.KubeBinDir, b)); err != nil {
			return nil, fmt.Errorf("%s missing in %s: run `make cluster-binaries`: %w", b, opts.KubeBinDir, err)
		}
	}
	if opts.RealNodes > 0 {
		for _, b := range append(RealNodeBinaries, "cni/bridge", "cni/host-local", "cni/loopback", "cni/portmap") {
			if _, err := os.Stat(filepath.Join(opts.KubeBinDir, b)); err != nil {
				return nil, fmt.Errorf("%s missing in %s: run `make real-node-binaries`: %w", b, opts.KubeBinDir, err)
			}
		}
	}
	// One cluster per machine (fixed addresses, one cgroup subtree): test
	// packages that each start one (go test runs them in parallel) take
	// turns. The lock is held until (*Cluster).Down or the process ends.
	lock, err := lockHost(ctx)
	if err != nil {
		return nil, err
	}
	if err := Down(opts); err != nil {
		lock.Close()
		return nil, fmt.Errorf("clean up the previous cluster: %w", err)
	}
	c, err := newCluster(opts)
	if err != nil {
		lock.Close()
		return nil, err
	}
	c.lock = lock
	c.state.Nodes = opts.Nodes
	if err := c.up(ctx); err != nil {
		return c, fmt.Errorf("%w (logs in %s)", err, filepath.Join(opts.StateDir, "logs"))
	}
	return c, nil
}

func newCluster(opts Options) (*Cluster, error) {
	root, err := cgroup2.Root()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
		return nil, err
	}
	st, err := loadState(opts.StateDir)
	if err != nil {
		return nil, err
	}
	return &Cluster{opts: opts, state: st, cgroupRoot: root, cgroupDir: filepath.Join(root, ClusterName),
		Kubeconfig: filepath.Join(opts.StateDir, "pki", "admin.kubeconfig")}, nil
}

func (c *Cluster) up(ctx context.Context) error {
	start := time.Now()
	c.phaseStart = start
	if c.opts.Self == "" {
		self, err := selfBinary(c.opts.StateDir)
		if err != nil {
			return err
		}
		c.opts.Self = self
	}
	// The previous run's logs stayed for a look after its `down`; now they go.
	if err := os.RemoveAll(c.LogDir()); err != nil {
		return err
	}
	pkiDir := filepath.Join(c.opts.StateDir, "pki")
	if err := pki(pkiDir); err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	if err := frontProxyPKI(pkiDir); err != nil {
		return fmt.Errorf("front-proxy certificates: %w", err)
	}
	for _, id := range identities {
		if _, err := kubeconfig(pkiDir, id.name); err != nil {
			return err
		}
	}
	if err := c.addRealNodeIdentities(pkiDir); err != nil {
		return err
	}
	c.phase("certificates")
	if err := c.setupHostNet(); err != nil {
		return fmt.Errorf("host network: %w", err)
	}
	if err := c.setupNodeDirs(); err != nil {
		return err
	}
	bin := func(name string) string { return filepath.Join(c.opts.KubeBinDir, name) }
	if err := os.RemoveAll(filepath.Join(c.opts.StateDir, "etcd")); err != nil {
		return err
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", EtcdPort)
	if err := c.startDaemon("etcd", bin("etcd"), "--data-dir", filepath.Join(c.opts.StateDir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", EtcdPeerPort),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", EtcdPeerPort),
		"--initial-cluster", fmt.Sprintf("default=http://127.0.0.1:%d", EtcdPeerPort),
		"--listen-metrics-urls", "http://127.0.0.1:12381", "--unsafe-no-fsync", "--log-level", "warn"); err != nil {
		return err
	}
	if err := waitHTTP(ctx, etcdURL+"/health", "", nil, 60*time.Second); err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	p := func(name string) string { return filepath.Join(pkiDir, name) }
	if err := c.startDaemon("kube-apiserver", bin("kube-apiserver"),
		"--etcd-servers", etcdURL,
		"--bind-address", HostIP.String(), "--advertise-address", HostIP.String(),
		fmt.Sprintf("--secure-port=%d", APIServerPort),
		"--service-cluster-ip-range", c.serviceCIDRs(),
		"--tls-cert-file", p("apiserver.crt"), "--tls-private-key-file", p("apiserver.key"),
		"--client-ca-file", p("ca.crt"), "--token-auth-file", p("tokens.csv"),
		"--service-account-issuer", "https://kubernetes.default.svc."+ClusterDomain,
		"--service-account-key-file", p("sa.pub"), "--service-account-signing-key-file", p("sa.key"),
		"--authorization-mode", "Node,RBAC", "--allow-privileged=true",
		"--enable-priority-and-fairness=false", "--profiling=false",
		// `kubectl logs` goes to the simulator's kubelet API on the node's IP.
		"--kubelet-client-certificate", p("kubelet-client.crt"), "--kubelet-client-key", p("kubelet-client.key"),
		"--kubelet-preferred-address-types=InternalIP",
		// The aggregation layer, as kubeadm sets it up: API services (the
		// controller's metrics APIs) get the caller's identity in
		// X-Remote-* headers from a client the front-proxy CA signed, and
		// are reached at their endpoints' addresses, not their ClusterIPs.
		"--requestheader-client-ca-file", p("front-proxy-ca.crt"),
		"--requestheader-allowed-names", frontProxyClient,
		"--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--proxy-client-cert-file", p("front-proxy-client.crt"), "--proxy-client-key-file", p("front-proxy-client.key"),
		"--enable-aggregator-routing=true",
		// An HPA may scale to zero on an Object or External metric
		// (alpha in 1.36): what users of the HPA with sockscale's
		// activator turn on.
		"--feature-gates=HPAScaleToZero=true"); err != nil {
		return err
	}
	admin, err := token(pkiDir, "admin")
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(p("ca.crt"))
	if err != nil {
		return err
	}
	if err := waitHTTP(ctx, fmt.Sprintf("https://%s:%d/readyz", HostIP, APIServerPort), admin, caPEM, 120*time.Second); err != nil {
		return fmt.Errorf("kube-apiserver: %w", err)
	}
	c.phase("etcd and kube-apiserver ready")
	if err := c.connect(); err != nil {
		return err
	}
	var kcmDualStack []string
	if c.opts.DualStack {
		// Only node CIDR allocation reads them, and it is off; given as a
		// dual-stack cluster's controller-manager has them: both families,
		// in the apiserver's order.
		kcmDualStack = []string{"--cluster-cidr", c.clusterCIDRs(), "--service-cluster-ip-range", c.serviceCIDRs()}
	}
	// Only now: started before the apiserver's RBAC bootstrap is done, they
	// exit (no one restarts them here).
	if err := c.startDaemon("kube-controller-manager", bin("kube-controller-manager"), append([]string{
		"--kubeconfig", p("kube-controller-manager.kubeconfig"),
		"--authentication-kubeconfig", p("kube-controller-manager.kubeconfig"),
		"--authorization-kubeconfig", p("kube-controller-manager.kubeconfig"),
		"--use-service-account-credentials=true",
		"--service-account-private-key-file", p("sa.key"), "--root-ca-file", p("ca.crt"),
		"--cluster-signing-cert-file", p("ca.crt"), "--cluster-signing-key-file", p("ca.key"),
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=10257",
		// Pod CIDRs are fixed per node by the simulator (NodeCIDR), not allocated.
		"--allocate-node-cidrs=false",
		"--feature-gates=HPAScaleToZero=true"}, kcmDualStack...)...); err != nil {
		return err
	}
	if err := c.startDaemon("kube-scheduler", bin("kube-scheduler"),
		"--kubeconfig", p("kube-scheduler.kubeconfig"),
		"--authentication-kubeconfig", p("kube-scheduler.kubeconfig"),
		"--authorization-kubeconfig", p("kube-scheduler.kubeconfig"),
		"--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=10259"); err != nil {
		return err
	}
	// The registry's blobs go with its manifests (in its memory): a new
	// cluster starts with an empty registry, and with nodes that have no
	// images, as new nodes do (a tag cached from an earlier cluster would
	// run an earlier build under IfNotPresent).
	for _, d := range []string{"registry", "images"} {
		if err := os.RemoveAll(filepath.Join(c.opts.StateDir, d)); err != nil {
			return err
		}
	}
	if err := c.startDaemon("registry", c.opts.Self, "registry", "--state-dir", c.opts.StateDir); err != nil {
		return err
	}
	if err := waitHTTP(ctx, "http://"+RegistryAddr+"/v2/", "", nil, 30*time.Second); err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	if err := c.startDaemon("node-simulator", c.opts.Self, "simulate", "--state-dir", c.opts.StateDir,
		"--nodes", fmt.Sprint(c.opts.Nodes), fmt.Sprintf("--dual-stack=%t", c.opts.DualStack)); err != nil {
		return err
	}
	if err := c.startRealNodes(ctx); err != nil {
		return err
	}
	if err := c.waitNodesReady(ctx, 60*time.Second); err != nil {
		return err
	}
	c.phase("nodes ready")
	// One kube-proxy for every node: they would share (and fight over) the
	// host's iptables. It runs as node-a; only externalTrafficPolicy/
	// internalTrafficPolicy Local differ from per-node proxies.
	if err := c.startDaemon("kube-proxy", bin("kube-proxy"),
		"--kubeconfig", p("kube-proxy.kubeconfig"), "--proxy-mode=iptables",
		// Both families' ranges if dual-stack: kube-proxy runs an
		// ip6tables proxier beside the iptables one whenever ip6tables
		// works, and tells pod traffic (not masqueraded) by --cluster-cidr.
		"--hostname-override", NodeName(0), "--cluster-cidr", c.clusterCIDRs(),
		"--nodeport-addresses", c.clusterCIDRs(),
		// Leave the host's conntrack sysctls alone.
		"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
		"--iptables-localhost-nodeports=false",
		"--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249"); err != nil {
		return err
	}
	corefile := filepath.Join(c.opts.StateDir, "Corefile")
	if err := os.WriteFile(corefile, []byte(c.corefile(p("admin.kubeconfig"))), 0o644); err != nil {
		return err
	}
	if err := c.startDaemon("coredns", bin("coredns"), "-conf", corefile); err != nil {
		return err
	}
	if err := waitDNS(ctx, "kubernetes.default.svc."+ClusterDomain, 60*time.Second); err != nil {
		return fmt.Errorf("coredns: %w", err)
	}
	c.phase("coredns ready")
	if err := c.waitKubeProxy(ctx, 60*time.Second); err != nil {
		return err
	}
	c.phase("kube-proxy ready")
	// Pods are refused until their namespace has its default ServiceAccount
	// and cannot start without kube-root-ca.crt: both come from the
	// controller-manager, so wait for them in "default".
	if err := poll(ctx, 60*time.Second, func() error {
		if _, err := c.Client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return fmt.Errorf("kube-controller-manager: %w", err)
		}
		_, err := c.Client.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err
	}); err != nil {
		return err
	}
	c.phase("default ServiceAccount ready")
	c.UpTime = time.Since(start)
	return nil
}

// corefileTmpl serves cluster.local and reverse lookups from the API and
// nothing else: no forward plugin, so no query ever leaves the machine.
const corefileTmpl = `cluster.local:%[1]d %[4]s {
    bind %[2]s
    errors
    kubernetes cluster.local %[5]s {
        kubeconfig %[3]s sockscale-cluster
        pods insecure
        fallthrough %[5]s
    }
    cache 5
    loadbalance
}
`

// corefile is CoreDNS's configuration. A dual-stack cluster's DNS listens
// on HostIP6 too and answers IPv6 reverse lookups; AAAA records for
// IPv6 ClusterIPs and pods come from the kubernetes plugin either way.
func (c *Cluster) corefile(kubeconfig string) string {
	bind, zones, reverse := HostIP.String(), fmt.Sprintf("in-addr.arpa:%d", DNSPort), "in-addr.arpa"
	if c.opts.DualStack {
		bind += " " + HostIP6.String()
		zones += fmt.Sprintf(" ip6.arpa:%d", DNSPort)
		reverse += " ip6.arpa"
	}
	return fmt.Sprintf(corefileTmpl, DNSPort, bind, kubeconfig, zones, reverse)
}

// serviceCIDRs is the value of --service-cluster-ip-range: IPv4 first,
// the primary family.
func (c *Cluster) serviceCIDRs() string {
	if c.opts.DualStack {
		return ServiceCIDR.String() + "," + ServiceCIDR6.String()
	}
	return ServiceCIDR.String()
}

// clusterCIDRs is the value of --cluster-cidr, IPv4 first.
func (c *Cluster) clusterCIDRs() string {
	if c.opts.DualStack {
		return ClusterCIDR.String() + "," + ClusterCIDR6.String()
	}
	return ClusterCIDR.String()
}

// setupNodeDirs makes each node's cgroup subtree and bpffs directory
// (mounting the host's bpffs at /sys/fs/bpf first if none is).
func (c *Cluster) setupNodeDirs() error {
	if !isBPFFS("/sys/fs/bpf") {
		if err := os.MkdirAll("/sys/fs/bpf", 0o755); err != nil {
			return err
		}
		if err := unix.Mount("bpffs", "/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("mount bpffs at /sys/fs/bpf: %w", err)
		}
		c.state.MountedBPFFS = true
		if err := c.state.save(c.opts.StateDir); err != nil {
			return err
		}
	}
	for i := 0; i < c.opts.Nodes; i++ {
		for _, d := range []string{nodeCgroup(c.cgroupRoot, NodeName(i)), filepath.Join(nodeCgroup(c.cgroupRoot, NodeName(i)), "pods"), nodeBPFFS(NodeName(i))} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
	}
	return nil
}

// nodeCgroup is node's cgroup subtree: the cgroup v2 root of its pods.
func nodeCgroup(root, node string) string { return filepath.Join(root, ClusterName, node) }

// nodeBPFFS is node's directory in the host's bpffs: its /sys/fs/bpf.
func nodeBPFFS(node string) string { return filepath.Join("/sys/fs/bpf", ClusterName, node) }

func bpffsUnused(dir string) bool {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if e.Name() != "maps.debug" && e.Name() != "progs.debug" {
			return false
		}
	}
	return true
}

func isBPFFS(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.BPF_FS_MAGIC
}

// Down stops the cluster of opts.StateDir and removes everything it made:
// processes, netns, links and routes, iptables rules (kube-proxy's too),
// cgroups, bpffs directories, etcd's data; sysctls get their old values.
// Nothing there is a no-op.
func Down(opts Options) error {
	if err := opts.defaults(); err != nil {
		return err
	}
	root, err := cgroup2.Root()
	if err != nil {
		return err
	}
	st, err := loadState(opts.StateDir)
	if err != nil {
		return err
	}
	var errs []error
	// Real nodes first: their containers, mounts and rules are not all in
	// our cgroup subtree or on links the host network's teardown knows.
	if err := stopRealNodes(opts.StateDir); err != nil {
		errs = append(errs, err)
	}
	// Everything we started is in our cgroup subtree; the PIDs are a
	// fallback for a subtree someone removed.
	if err := killCgroupTree(filepath.Join(root, ClusterName)); err != nil {
		errs = append(errs, err)
	}
	for _, p := range st.Processes {
		if p.alive() {
			_ = unix.Kill(p.PID, unix.SIGKILL)
		}
	}
	if err := os.RemoveAll(filepath.Join("/sys/fs/bpf", ClusterName)); err != nil {
		errs = append(errs, fmt.Errorf("remove bpffs directory: %w", err))
	}
	if err := teardownHostNet(st, filepath.Join(opts.KubeBinDir, "kube-proxy")); err != nil {
		errs = append(errs, err)
	}
	// Unmounted only if nobody else pinned anything there meanwhile (the
	// agent's own tests use /sys/fs/bpf too); maps.debug and progs.debug are
	// the kernel's own.
	if st.MountedBPFFS && bpffsUnused("/sys/fs/bpf") {
		if err := unix.Unmount("/sys/fs/bpf", 0); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount /sys/fs/bpf: %w", err))
		}
	}
	if err := removeCreatedPaths(opts.StateDir); err != nil {
		errs = append(errs, err)
	}
	for _, d := range []string{"etcd", "pods", "nodes"} {
		if err := os.RemoveAll(filepath.Join(opts.StateDir, d)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := os.Remove(statePath(opts.StateDir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Down stops c (see the function Down) and lets another Up on this
// machine go on.
func (c *Cluster) Down() error {
	err := Down(c.opts)
	if c.lock != nil {
		c.lock.Close()
		c.lock = nil
	}
	return err
}

// LockPath is the file Up locks for the cluster's lifetime.
const LockPath = "/run/lock/sockscale-cluster.lock"

// KubeFirewallMarker exists while the host's KUBE-FIREWALL chain, in the
// families (iptables, ip6tables) it names, is one a cluster of ours made
// (kube-proxy makes it and its --cleanup leaves it), so that `down`, of
// this cluster or a later one, removes it.
const KubeFirewallMarker = "/run/lock/sockscale-cluster.kube-firewall"

// lockHost waits for the machine-wide cluster lock.
func lockHost(ctx context.Context) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(LockPath), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(LockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	told := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", LockPath, err)
		}
		if !told {
			fmt.Fprintf(os.Stderr, "sockscale-cluster: waiting for another local cluster to go down (lock %s)\n", LockPath)
			told = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("wait for another local cluster to go down (lock %s): %w", LockPath, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// StateDir is where c keeps its state and logs.
func (c *Cluster) StateDir() string { return c.opts.StateDir }

// LogDir holds one log file per control-plane process, and pods/ with the
// containers' logs (see PodLogPath).
func (c *Cluster) LogDir() string { return filepath.Join(c.opts.StateDir, "logs") }

func (c *Cluster) connect() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 50, 100
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	c.Config, c.Client = cfg, cs
	return nil
}

// Connect returns the running cluster of opts.StateDir.
func Connect(opts Options) (*Cluster, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	c, err := newCluster(opts)
	if err != nil {
		return nil, err
	}
	return c, c.connect()
}

// Status writes what runs and the nodes' state to w.
func (c *Cluster) Status(ctx context.Context, out io.Writer) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	defer func() { _ = w.Flush() }()
	if len(c.state.Processes) == 0 {
		fmt.Fprintln(w, "no cluster in", c.opts.StateDir)
		return nil
	}
	fmt.Fprintf(w, "PROCESS\tPID\tSTATE\tLOG\n")
	for _, p := range c.state.Processes {
		s := "running"
		if !p.alive() {
			s = "gone"
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", p.Name, p.PID, s, filepath.Join(c.LogDir(), p.Name+".log"))
	}
	fmt.Fprintf(w, "kubeconfig: %s\n", c.Kubeconfig)
	fmt.Fprintf(w, "registry: %s (plain HTTP; push images to %s/<path>/<name>:<tag>)\n", RegistryAddr, RegistryAddr)
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	fmt.Fprintf(w, "NODE\tREADY\tADDRESS\tPOD-CIDR\tPODS\n")
	for _, n := range nodes.Items {
		pods, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
		if err != nil {
			return err
		}
		var addr string
		if len(n.Status.Addresses) > 0 {
			addr = n.Status.Addresses[0].Address
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\n", n.Name, nodeReady(&n), addr, n.Spec.PodCIDR, len(pods.Items))
	}
	return nil
}

func nodeReady(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return corev1.ConditionUnknown
}

func (c *Cluster) waitNodesReady(ctx context.Context, timeout time.Duration) error {
	return poll(ctx, timeout, func() error {
		nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		ready := 0
		for _, n := range nodes.Items {
			if nodeReady(&n) == corev1.ConditionTrue {
				ready++
			}
		}
		if want := c.opts.Nodes + c.opts.RealNodes; ready < want {
			return fmt.Errorf("%d of %d nodes ready (see logs/node-simulator.log, realnodes/*/logs)", ready, want)
		}
		return nil
	})
}

// waitKubeProxy waits until kube-proxy has programmed the kubernetes
// Service, so a test's first ClusterIP request does not race it.
func (c *Cluster) waitKubeProxy(ctx context.Context, timeout time.Duration) error {
	return poll(ctx, timeout, func() error {
		out, err := output("iptables", "-w", "-t", "nat", "-S", "KUBE-SERVICES")
		if err != nil {
			return err
		}
		if !strings.Contains(out, KubernetesServiceIP.String()) {
			return errors.New("kube-proxy has not programmed the kubernetes Service (see logs/kube-proxy.log)")
		}
		// The kubernetes Service has no IPv6 ClusterIP (IPv4 is the
		// primary family): the IPv6 proxier's chain is all there is to see.
		if c.opts.DualStack {
			if err := run("ip6tables", "-w", "-t", "nat", "-S", "KUBE-SERVICES"); err != nil {
				return fmt.Errorf("kube-proxy has not made its ip6tables rules (see logs/kube-proxy.log): %w", err)
			}
		}
		return nil
	})
}

func poll(ctx context.Context, timeout time.Duration, f func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %s: %w", timeout, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func waitHTTP(ctx context.Context, url, bearer string, caPEM []byte, timeout time.Duration) error {
	tr := &http.Transport{}
	if caPEM != nil {
		pool, err := certPool(caPEM)
		if err != nil {
			return err
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	}
	hc := &http.Client{Transport: tr, Timeout: 2 * time.Second}
	return poll(ctx, timeout, func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s: %s", url, resp.Status, body)
		}
		return nil
	})
}

// waitDNS waits until the cluster DNS answers name.
func waitDNS(ctx context.Context, name string, timeout time.Duration) error {
	r := Resolver()
	return poll(ctx, timeout, func() error {
		_, err := r.LookupHost(ctx, name)
		return err
	})
}

// Resolver asks the cluster DNS, from the host.
func Resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, net.JoinHostPort(HostIP.String(), fmt.Sprint(DNSPort)))
	}}
}

// selfBinary builds sockscale-cluster into the state dir (go's build cache
// makes it quick after the first time).
func selfBinary(stateDir string) (string, error) {
	if exe, err := os.Executable(); err == nil && filepath.Base(exe) == "sockscale-cluster" {
		return exe, nil
	}
	out := filepath.Join(stateDir, "bin", "sockscale-cluster")
	cmd := exec.Command("go", "build", "-o", out, "github.com/sockscale/sockscale/test/cluster/cmd/sockscale-cluster")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build sockscale-cluster: %w: %s", err, b)
	}
	return out, nil
}

// removeCreatedPaths removes the mount points pod-init had to create on the
// host (see bindMount).
func removeCreatedPaths(stateDir string) error {
	log := filepath.Join(stateDir, "created-paths")
	b, err := os.ReadFile(log)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, p := range strings.Split(string(b), "\n") {
		if p = filepath.Clean(p); p == "." || p == "/" || !filepath.IsAbs(p) {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return os.Remove(log)
}

// phase appends how long up took to reach a step to <state-dir>/logs/up.log.
func (c *Cluster) phase(name string) {
	if err := os.MkdirAll(c.LogDir(), 0o755); err != nil {
		return
	}
	f, err := os.OpenFile(filepath.Join(c.LogDir(), "up.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s +%s %s\n", time.Now().Format(time.RFC3339), time.Since(c.phaseStart).Round(10*time.Millisecond), name)
}
