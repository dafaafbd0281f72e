package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
	"github.com/sockscale/sockscale/internal/testutil/localroute"
)

// A real node: containerd (with runc and the CNI plugins) and a kubelet run
// as processes on the host, beside the simulated nodes. StartRealNode runs
// one on its own (no API server: static pods from StaticPodDir) or, with a
// Kubeconfig, registered with a cluster; StopRealNode removes everything
// it made. `make real-node-binaries` builds what it runs.

// RealNodeBinaries are the binaries a real node needs in its BinDir, and
// cni/ with the CNI plugins (runc is the host's).
var RealNodeBinaries = []string{"kubelet", "containerd", "containerd-shim-runc-v2"}

// RealNodeOptions says what real node to run.
type RealNodeOptions struct {
	// Name is the node's name (the kubelet's --hostname-override).
	Name string
	// Dir keeps everything the node writes: containerd's root and state,
	// the kubelet's root dir, pod logs, CNI leases, configs, logs
	// (<Dir>/logs/{containerd,kubelet}.log) and realnode.json, the
	// processes to stop.
	Dir string
	// RunDir holds the sockets (containerd's, its shims'; a unix socket's
	// path is limited to 107 bytes, so it is short) and runc's state.
	// Default /run/sccl-<Name>.
	RunDir string
	// BinDir holds RealNodeBinaries and cni/ (make real-node-binaries
	// links them into the cluster's bin dir).
	BinDir string
	// Runc is runc's path; default: runc on PATH.
	Runc string
	// PodCIDR is the node's pod range; its first address is the bridge's,
	// the pods' gateway and the kubelet API's.
	PodCIDR netip.Prefix
	// PodCIDR6, if valid, makes the node dual-stack: its IPv6 pod range
	// (pods get an address of each, IPv4 first), whose first address is
	// the bridge's IPv6 one, the pods' IPv6 gateway and the node's second
	// IP.
	PodCIDR6 netip.Prefix
	// PodRoutes are the pods' routes through the gateway (of their
	// family) besides their own subnets (none: pods reach only their
	// bridge).
	PodRoutes []netip.Prefix
	// Bridge is the pods' bridge, made by StartRealNode (named with
	// Prefix, so a cluster's down removes it too).
	Bridge string
	// SandboxImage is containerd's pause image.
	SandboxImage string
	// PlainHTTPRegistries are host:port registries pulled over HTTP.
	PlainHTTPRegistries []string
	// CgroupParent is the node's cgroup, relative to each hierarchy's
	// root (v2 and, on hybrid hosts, every v1 one): the daemons run in
	// <CgroupParent>/daemons, pods below <CgroupParent>/kubepods.
	CgroupParent string
	// StaticPodDir is the kubelet's staticPodPath; default <Dir>/manifests.
	StaticPodDir string
	// Kubeconfig is the kubelet's; empty: standalone, no API server.
	Kubeconfig string
	// ClientCAFile verifies the client certificates of the kubelet API's
	// callers (the apiserver's --kubelet-client-certificate) when the node
	// has a Kubeconfig; their requests are then authorized by the API
	// server (webhook).
	ClientCAFile string
	// ClusterDNS are the pods' name servers (none: the pods have none).
	ClusterDNS []netip.Addr
	// KubeletPort is the kubelet API's port (default 10250) on the
	// gateway; HealthzPort its healthz on 127.0.0.1 (default 10248).
	KubeletPort, HealthzPort int
}

func (o *RealNodeOptions) defaults() error {
	if o.Name == "" || o.Dir == "" || o.BinDir == "" || !o.PodCIDR.IsValid() || o.Bridge == "" || o.SandboxImage == "" || o.CgroupParent == "" {
		return errors.New("real node: Name, Dir, BinDir, PodCIDR, Bridge, SandboxImage and CgroupParent are required")
	}
	if o.RunDir == "" {
		o.RunDir = filepath.Join("/run", Prefix+"-"+o.Name)
	}
	if o.StaticPodDir == "" {
		o.StaticPodDir = filepath.Join(o.Dir, "manifests")
	}
	if o.KubeletPort == 0 {
		o.KubeletPort = 10250
	}
	if o.HealthzPort == 0 {
		o.HealthzPort = 10248
	}
	if o.Runc == "" {
		p, err := exec.LookPath("runc")
		if err != nil {
			return fmt.Errorf("real node: runc (make deps installs it): %w", err)
		}
		o.Runc = p
	}
	for _, b := range RealNodeBinaries {
		if _, err := os.Stat(filepath.Join(o.BinDir, b)); err != nil {
			return fmt.Errorf("real node: %s missing in %s: run `make real-node-binaries`: %w", b, o.BinDir, err)
		}
	}
	return nil
}

// realNodeState is <Dir>/realnode.json: what StopRealNode undoes.
type realNodeState struct {
	Options   RealNodeOptions `json:"options"`
	Processes []process       `json:"processes"`
	// HostDirsMade are those of realNodeHostDirs that did not exist
	// before the node started: the node made them, its stop removes them.
	HostDirsMade []string `json:"hostDirsMade,omitempty"`
}

// realNodeHostDirs are the host paths a real node writes to whatever its
// configuration says: the kubelet's device-plugin socket directory
// (/var/lib/kubelet/device-plugins) and its links to the containers' logs
// (/var/log/containers), both constants, and libcni's cache of results
// (/var/lib/cni, which containerd does not move).
var realNodeHostDirs = []string{"/var/lib/kubelet", "/var/log/containers", "/var/lib/cni"}

// RealNode is a running real node.
type RealNode struct {
	opts  RealNodeOptions
	paths realNodePaths
	state realNodeState
}

// StartRealNode starts a real node after removing what a previous one in
// the same Dir left. It needs root. On error, StopRealNode(opts.Dir)
// removes what it made.
func StartRealNode(ctx context.Context, opts RealNodeOptions) (*RealNode, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("a real node needs root (containerd, cgroups, bridges, netns)")
	}
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if err := StopRealNode(opts.Dir); err != nil {
		return nil, fmt.Errorf("clean up the previous real node in %s: %w", opts.Dir, err)
	}
	n := &RealNode{opts: opts, paths: realNodePaths{dir: opts.Dir}, state: realNodeState{Options: opts}}
	for _, d := range realNodeHostDirs {
		if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
			n.state.HostDirsMade = append(n.state.HostDirsMade, d)
		}
	}
	// The previous start's logs stayed for a look after its stop; now they go.
	if err := os.RemoveAll(n.paths.logs()); err != nil {
		return nil, err
	}
	// Saved first, so a start that fails half-way is stopped completely.
	if err := n.save(); err != nil {
		return nil, err
	}
	if err := n.start(ctx); err != nil {
		return n, fmt.Errorf("real node %s: %w (logs in %s)", opts.Name, err, n.paths.logs())
	}
	return n, nil
}

func (n *RealNode) save() error {
	b, err := json.MarshalIndent(n.state, "", "  ")
	if err != nil {
		return err
	}
	return writeFileMkdir(n.paths.stateFile(), b)
}

func (n *RealNode) start(ctx context.Context) error {
	o := &n.opts
	for _, d := range []string{o.StaticPodDir, o.RunDir, n.paths.podLogs()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := o.writeContainerdConfig(n.paths); err != nil {
		return err
	}
	if err := o.writeCNIConfig(n.paths); err != nil {
		return err
	}
	if err := o.writeKubeletConfig(n.paths); err != nil {
		return err
	}
	if err := makeNodeCgroups(o.CgroupParent); err != nil {
		return err
	}
	// The bridge before the kubelet, which listens on its address; the
	// bridge plugin takes it as it finds it.
	gw, gw6 := o.gateway(), o.gateway6()
	nodeIPs := gw.String()
	addrs := []netip.Prefix{netip.PrefixFrom(gw, o.PodCIDR.Bits())}
	if gw6.IsValid() {
		nodeIPs += "," + gw6.String()
		addrs = append(addrs, netip.PrefixFrom(gw6, o.PodCIDR6.Bits()))
	}
	if err := addBridge(o.Bridge, podMAC(gw), addrs...); err != nil {
		return err
	}
	// Whatever the pods get must stay on this machine.
	for _, a := range addrs {
		if err := localroute.Check(a.Addr().Next(), localroute.Dev(o.Bridge)); err != nil {
			return fmt.Errorf("route check: %w; refusing to start", err)
		}
	}
	v2, err := cgroup2.Root()
	if err != nil {
		return err
	}
	daemons := filepath.Join(v2, o.CgroupParent, "daemons")
	bin := func(name string) string { return filepath.Join(o.BinDir, name) }
	// containerd finds its shim on PATH (and next to itself).
	path := "PATH=" + o.BinDir + ":" + os.Getenv("PATH")
	p, err := spawn(daemon{name: "containerd", bin: bin("containerd"), dir: o.Dir, logDir: n.paths.logs(),
		cgroup: filepath.Join(daemons, "containerd"), env: []string{path},
		args: []string{"--config", n.paths.containerdConfig()}})
	if err != nil {
		return err
	}
	n.state.Processes = append(n.state.Processes, p)
	if err := n.save(); err != nil {
		return err
	}
	if err := poll(ctx, 30*time.Second, func() error {
		c, err := net.Dial("unix", o.containerdSocket())
		if err != nil {
			if !p.alive() {
				return fmt.Errorf("containerd exited: %w", err)
			}
			return err
		}
		return c.Close()
	}); err != nil {
		return fmt.Errorf("containerd: %w", err)
	}
	// --cert-dir defaults to /var/lib/kubelet/pki whatever --root-dir is.
	args := []string{"--config", n.paths.kubeletConfig(), "--root-dir", n.paths.kubeletRoot(),
		"--cert-dir", filepath.Join(n.paths.kubeletRoot(), "pki"),
		"--hostname-override", o.Name, "--node-ip", nodeIPs, "--v", "2"}
	if o.Kubeconfig != "" {
		args = append(args, "--kubeconfig", o.Kubeconfig)
	}
	p, err = spawn(daemon{name: "kubelet", bin: bin("kubelet"), dir: o.Dir, logDir: n.paths.logs(),
		cgroup: filepath.Join(daemons, "kubelet"), env: []string{path}, args: args})
	if err != nil {
		return err
	}
	n.state.Processes = append(n.state.Processes, p)
	if err := n.save(); err != nil {
		return err
	}
	return waitHTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/healthz", o.HealthzPort), "", nil, 60*time.Second)
}

// Options are the node's options, defaults filled in.
func (n *RealNode) Options() RealNodeOptions { return n.opts }

// LogDir holds containerd.log and kubelet.log.
func (n *RealNode) LogDir() string { return n.paths.logs() }

// PodLogDir is the kubelet's podLogsDir.
func (n *RealNode) PodLogDir() string { return n.paths.podLogs() }

// Stop stops the node and removes what it made (StopRealNode).
func (n *RealNode) Stop() error { return StopRealNode(n.opts.Dir) }

// StopRealNode stops the real node whose Dir is dir and removes what it
// made on the host: its processes and every process in its cgroups (the
// shims and the containers), the mounts below Dir and RunDir (rootfs,
// shm, netns), the bridge, portmap's iptables rules, the cgroups, the
// sockets. Dir keeps the logs. Nothing there is a no-op.
func StopRealNode(dir string) error {
	b, err := os.ReadFile(realNodePaths{dir: dir}.stateFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var st realNodeState
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("read %s: %w", realNodePaths{dir: dir}.stateFile(), err)
	}
	o := st.Options
	p := realNodePaths{dir: o.Dir}
	var errs []error
	// The kubelet first, so that nothing starts containers again.
	for i := len(st.Processes) - 1; i >= 0; i-- {
		if pr := st.Processes[i]; pr.alive() {
			_ = unix.Kill(pr.PID, unix.SIGKILL)
		}
	}
	// Shims and containers: every process in the node's cgroups.
	if err := killNodeCgroups(o.CgroupParent); err != nil {
		errs = append(errs, err)
	}
	// Netns (their veths go with them), rootfs, shm: below Dir and RunDir.
	for _, d := range []string{o.Dir, o.RunDir} {
		if err := unmountBelow(d); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removePortmapRules(o.Bridge); err != nil {
		errs = append(errs, err)
	}
	if l, err := netlink.LinkByName(o.Bridge); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete bridge %s: %w", o.Bridge, err))
		}
	}
	if err := removeNodeCgroups(o.CgroupParent); err != nil {
		errs = append(errs, err)
	}
	// The runtime state goes: a next start begins as a new node would.
	// Pulled images go too (containerd's root): they come from a local
	// registry in a second.
	for _, d := range []string{o.RunDir, p.containerdRoot(), p.containerdState(), p.kubeletRoot(), p.podLogs(), p.ipamDir()} {
		if err := os.RemoveAll(d); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeCNICache(o.Bridge, o.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := removeHostDirs(st.HostDirsMade, o.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return os.Remove(p.stateFile())
}

// RealNodeDir is where a cluster keeps real node name's Dir:
// <state-dir>/realnodes/<name>; Down stops every node there.
func RealNodeDir(stateDir, name string) string {
	return filepath.Join(stateDir, "realnodes", name)
}

// stopRealNodes stops every real node of the cluster in stateDir.
func stopRealNodes(stateDir string) error {
	entries, err := os.ReadDir(filepath.Join(stateDir, "realnodes"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if err := StopRealNode(RealNodeDir(stateDir, e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("real node %s: %w", e.Name(), err))
		}
	}
	return errors.Join(errs...)
}
