package cluster

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// The real node's configuration files, all under its Dir (see realNodePaths).

// containerdConfigTmpl is containerd 2.4's config (version 4: the servers'
// addresses are plugins' settings; a version 3 file is migrated on load).
// Every path the defaults put under /var/lib, /run, /opt or /etc is set, so
// the node keeps to its own directories and shares nothing with a
// containerd the host may have. The %[n] arguments are in containerdConfig.
const containerdConfigTmpl = `# Written by sockscale's test/cluster (realnode_config.go) for node %[1]s.
version = 4
root = %[2]s
state = %[3]s
# Nothing from /etc/containerd/conf.d.
imports = []

[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = %[4]s
  [plugins.'io.containerd.server.v1.ttrpc']
    address = %[5]s
  [plugins.'io.containerd.shim.v1.manager']
    socket_dir = %[6]s
  [plugins.'io.containerd.internal.v1.opt']
    path = %[7]s
  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = %[8]s
  # NRI would listen on /var/run/nri/nri.sock, one per host.
  [plugins.'io.containerd.nri.v1.nri']
    disable = true

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = %[9]s
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = %[10]s

  [plugins.'io.containerd.transfer.v1.local']
    config_path = %[10]s

  [plugins.'io.containerd.cri.v1.runtime']
    # The pods' netns are bind-mounted under state, not /var/run/netns, so
    # that down finds (and unmounts) every one of them there.
    netns_mounts_under_state_dir = true
    cdi_spec_dirs = []
    # No lower oom_score_adj than containerd's own: the kubelet asks -998
    # for sandboxes and -997 for Guaranteed pods, and lowering it needs
    # CAP_SYS_RESOURCE, which a test machine's root may lack (runc init
    # then dies: "can't get final child's PID from pipe: EOF").
    restrict_oom_score_adj = true
    enable_criu = false
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = %[11]s
          # Its own runc root, not /run/runc.
          Root = %[12]s
          # cgroupfs, as the kubelet's cgroupDriver: no systemd runs here.
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [%[13]s]
      conf_dir = %[14]s
      max_conf_num = 1

  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
`

// realNodePaths are where a real node keeps what it writes.
type realNodePaths struct {
	dir string
}

func (p realNodePaths) containerdRoot() string  { return filepath.Join(p.dir, "containerd", "root") }
func (p realNodePaths) containerdState() string { return filepath.Join(p.dir, "containerd", "state") }
func (p realNodePaths) containerdConfig() string {
	return filepath.Join(p.dir, "containerd", "config.toml")
}
func (p realNodePaths) certsDir() string      { return filepath.Join(p.dir, "containerd", "certs.d") }
func (p realNodePaths) cniConfDir() string    { return filepath.Join(p.dir, "cni", "net.d") }
func (p realNodePaths) ipamDir() string       { return filepath.Join(p.dir, "cni", "networks") }
func (p realNodePaths) kubeletRoot() string   { return filepath.Join(p.dir, "kubelet") }
func (p realNodePaths) kubeletConfig() string { return filepath.Join(p.dir, "kubelet-config.yaml") }
func (p realNodePaths) podLogs() string       { return filepath.Join(p.dir, "pods") }
func (p realNodePaths) logs() string          { return filepath.Join(p.dir, "logs") }
func (p realNodePaths) stateFile() string     { return filepath.Join(p.dir, "realnode.json") }

// tomlString quotes s as a TOML basic string: Go's quoting is the same for
// the printable ASCII of paths and image references.
func tomlString(s string) string { return strconv.Quote(s) }

// writeContainerdConfig writes containerd's config.toml and, for each
// registry, a hosts.toml that sends pulls to it over plain HTTP.
func (o *RealNodeOptions) writeContainerdConfig(p realNodePaths) error {
	var bins []string
	for _, d := range []string{o.cniBinDir()} {
		bins = append(bins, tomlString(d))
	}
	cfg := fmt.Sprintf(containerdConfigTmpl, o.Name,
		tomlString(p.containerdRoot()), tomlString(p.containerdState()),
		tomlString(o.containerdSocket()), tomlString(o.containerdSocket()+".ttrpc"),
		tomlString(filepath.Join(o.RunDir, "s")),
		tomlString(filepath.Join(p.containerdRoot(), "opt")),
		tomlString(filepath.Join(p.containerdRoot(), "image-verifier")),
		tomlString(o.SandboxImage), tomlString(p.certsDir()),
		tomlString(o.Runc), tomlString(filepath.Join(o.RunDir, "runc")),
		strings.Join(bins, ", "), tomlString(p.cniConfDir()))
	if err := writeFileMkdir(p.containerdConfig(), []byte(cfg)); err != nil {
		return err
	}
	for _, r := range o.PlainHTTPRegistries {
		// containerd looks for <config_path>/<host:port>/hosts.toml.
		hosts := fmt.Sprintf("server = %s\n\n[host.%s]\n  capabilities = ['pull', 'resolve']\n",
			tomlString("http://"+r), tomlString("http://"+r))
		if err := writeFileMkdir(filepath.Join(p.certsDir(), r, "hosts.toml"), []byte(hosts)); err != nil {
			return err
		}
	}
	return nil
}

// writeCNIConfig writes the pod network: the bridge plugin on o.Bridge
// (gateway = the bridge's address, no masquerade: nothing is NATed off
// the machine), host-local IPAM over o.PodCIDR (and o.PodCIDR6: one
// address of each, IPv4 first) with its leases under the node's dir, and
// portmap for hostPorts. containerd adds lo itself with the loopback
// plugin from the same bin dir.
func (o *RealNodeOptions) writeCNIConfig(p realNodePaths) error {
	var routes []map[string]string
	for _, r := range o.PodRoutes {
		routes = append(routes, map[string]string{"dst": r.String()})
	}
	ranges := [][]map[string]string{{{"subnet": o.PodCIDR.String(), "gateway": o.gateway().String()}}}
	if o.PodCIDR6.IsValid() {
		ranges = append(ranges, []map[string]string{{"subnet": o.PodCIDR6.String(), "gateway": o.gateway6().String()}})
	}
	ipam := map[string]any{
		"type":    "host-local",
		"ranges":  ranges,
		"dataDir": p.ipamDir(),
	}
	if len(routes) > 0 {
		ipam["routes"] = routes
	}
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       o.Bridge,
		"plugins": []map[string]any{
			{
				"type": "bridge", "bridge": o.Bridge, "isGateway": true, "ipMasq": false,
				"hairpinMode": true, "ipam": ipam,
			},
			// iptables, as kube-proxy's rules on this host (portmap would pick
			// nftables on a host without iptables).
			{"type": "portmap", "backend": "iptables", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	return writeFileMkdir(filepath.Join(p.cniConfDir(), "10-"+o.Bridge+".conflist"), b)
}

// writeKubeletConfig writes the KubeletConfiguration. What this host
// needs and a cgroup v2 node does not: failCgroupV1 false (1.35+ kubelets
// refuse v1 otherwise; a hybrid host is v1 to them, as to runc).
func (o *RealNodeOptions) writeKubeletConfig(p realNodePaths) error {
	cfg := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		// Hybrid cgroups are v1 to the kubelet.
		"failCgroupV1": false,
		"cgroupDriver": "cgroupfs",
		// Pods' cgroups go below the node's own subtree (kubepods under
		// it, in every hierarchy), never at the hierarchies' roots.
		"cgroupRoot":               "/" + o.CgroupParent,
		"cgroupsPerQOS":            true,
		"enforceNodeAllocatable":   []string{"pods"},
		"containerRuntimeEndpoint": "unix://" + o.containerdSocket(),
		"staticPodPath":            o.StaticPodDir,
		// Polled every 20 s by default; a test's pod should not wait that.
		"fileCheckFrequency": "2s",
		"podLogsDir":         p.podLogs(),
		"podCIDR":            o.podCIDRs(),
		// The kubelet API on the node's own address only: the simulated
		// nodes' kubelet APIs listen on their addresses' port 10250 too.
		"address":            o.gateway().String(),
		"port":               o.KubeletPort,
		"readOnlyPort":       0,
		"healthzBindAddress": "127.0.0.1",
		"healthzPort":        o.HealthzPort,
		"failSwapOn":         false,
		// No KUBE-FIREWALL or KUBE-KUBELET-CANARY chains from the kubelet:
		// the host's iptables are shared with the simulated nodes and the
		// cluster's one kube-proxy (which makes KUBE-FIREWALL, and whose
		// `down` removes it), and a standalone node would leave them.
		"makeIPTablesUtilChains": false,
		// No host resolv.conf in pods: its name servers are off the machine.
		"resolvConf":                    "",
		"hairpinMode":                   "hairpin-veth",
		"serializeImagePulls":           false,
		"registerNode":                  o.Kubeconfig != "",
		"rotateCertificates":            false,
		"serverTLSBootstrap":            false,
		"protectKernelDefaults":         false,
		"localStorageCapacityIsolation": true,
		// The test machine's disk may be fuller than the defaults allow;
		// evicting the node's few pods would prove nothing.
		"evictionHard":                map[string]string{"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
	}
	if o.Kubeconfig == "" {
		// No API server to ask whether a client may call the kubelet API:
		// anyone may, on the node's bridge address only. Its /pods is how
		// a standalone node's pod statuses are read (the tests).
		cfg["authentication"] = map[string]any{
			"anonymous": map[string]bool{"enabled": true},
			"webhook":   map[string]bool{"enabled": false},
		}
		cfg["authorization"] = map[string]string{"mode": "AlwaysAllow"}
	} else {
		cfg["authentication"] = map[string]any{
			"anonymous": map[string]bool{"enabled": false},
			"webhook":   map[string]bool{"enabled": true},
			"x509":      map[string]string{"clientCAFile": o.ClientCAFile},
		}
		cfg["authorization"] = map[string]string{"mode": "Webhook"}
	}
	if len(o.ClusterDNS) > 0 {
		var dns []string
		for _, a := range o.ClusterDNS {
			dns = append(dns, a.String())
		}
		cfg["clusterDNS"] = dns
		cfg["clusterDomain"] = ClusterDomain
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	return writeFileMkdir(p.kubeletConfig(), b)
}

// gateway is the bridge's address: the pods' gateway and the node's IP.
func (o *RealNodeOptions) gateway() netip.Addr { return o.PodCIDR.Masked().Addr().Next() }

// gateway6 is the bridge's IPv6 address, invalid unless dual-stack.
func (o *RealNodeOptions) gateway6() netip.Addr {
	if !o.PodCIDR6.IsValid() {
		return netip.Addr{}
	}
	return o.PodCIDR6.Masked().Addr().Next()
}

// podCIDRs is the kubelet's podCIDR: both ranges, comma-separated, if
// dual-stack.
func (o *RealNodeOptions) podCIDRs() string {
	if o.PodCIDR6.IsValid() {
		return o.PodCIDR.String() + "," + o.PodCIDR6.String()
	}
	return o.PodCIDR.String()
}

func (o *RealNodeOptions) containerdSocket() string {
	return filepath.Join(o.RunDir, "containerd.sock")
}

func (o *RealNodeOptions) cniBinDir() string { return filepath.Join(o.BinDir, "cni") }

func writeFileMkdir(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
