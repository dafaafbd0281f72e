package cluster

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestRealNodeConfigs checks what the real node's configurations must say
// on any host (the e2e test proves they work on this one).
func TestRealNodeConfigs(t *testing.T) {
	dir := t.TempDir()
	o := RealNodeOptions{
		Name: "real-a", Dir: dir, RunDir: "/run/sccl-real-a", BinDir: "/bin-dir", Runc: "/usr/sbin/runc",
		PodCIDR: netip.MustParsePrefix("10.244.200.0/24"), Bridge: "sccl-real0",
		SandboxImage: "127.0.0.1:12490/sockscale/pause:t", PlainHTTPRegistries: []string{"127.0.0.1:12490"},
		CgroupParent: "sockscale-realnode/real-a", StaticPodDir: filepath.Join(dir, "manifests"),
		KubeletPort: 10250, HealthzPort: 12448,
	}
	p := realNodePaths{dir: dir}
	if err := o.writeContainerdConfig(p); err != nil {
		t.Fatal(err)
	}
	if err := o.writeCNIConfig(p); err != nil {
		t.Fatal(err)
	}
	if err := o.writeKubeletConfig(p); err != nil {
		t.Fatal(err)
	}

	ctr := readText(t, p.containerdConfig())
	for _, want := range []string{
		"version = 4", `root = "` + dir + `/containerd/root"`, `address = "/run/sccl-real-a/containerd.sock"`,
		`sandbox = "127.0.0.1:12490/sockscale/pause:t"`, "SystemdCgroup = false", "restrict_oom_score_adj = true",
		"netns_mounts_under_state_dir = true", `bin_dirs = ["/bin-dir/cni"]`, `BinaryName = "/usr/sbin/runc"`,
	} {
		if !strings.Contains(ctr, want) {
			t.Errorf("containerd config lacks %q:\n%s", want, ctr)
		}
	}
	// Nothing of the host's defaults may remain (comments aside).
	var settings []string
	for _, line := range strings.Split(ctr, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			settings = append(settings, line)
		}
	}
	for _, bad := range []string{"/var/lib/containerd", "/run/containerd", "/opt/", "/etc/"} {
		if strings.Contains(strings.Join(settings, "\n"), bad) {
			t.Errorf("containerd config names %s", bad)
		}
	}
	if hosts := readText(t, filepath.Join(p.certsDir(), "127.0.0.1:12490", "hosts.toml")); !strings.Contains(hosts, `server = "http://127.0.0.1:12490"`) {
		t.Errorf("hosts.toml:\n%s", hosts)
	}

	var cni struct {
		Name    string           `json:"name"`
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(readText(t, filepath.Join(p.cniConfDir(), "10-sccl-real0.conflist"))), &cni); err != nil {
		t.Fatal(err)
	}
	if len(cni.Plugins) != 2 || cni.Plugins[0]["type"] != "bridge" || cni.Plugins[0]["bridge"] != "sccl-real0" ||
		cni.Plugins[0]["ipMasq"] != false || cni.Plugins[1]["type"] != "portmap" {
		t.Errorf("CNI config: %+v", cni)
	}
	ipam := cni.Plugins[0]["ipam"].(map[string]any)
	if ipam["dataDir"] != p.ipamDir() || ipam["routes"] != nil {
		t.Errorf("ipam: %+v (want leases under the node's dir and no routes)", ipam)
	}

	var kc map[string]any
	if err := yaml.Unmarshal([]byte(readText(t, p.kubeletConfig())), &kc); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]any{
		"failCgroupV1": false, "cgroupDriver": "cgroupfs", "cgroupRoot": "/sockscale-realnode/real-a",
		"containerRuntimeEndpoint": "unix:///run/sccl-real-a/containerd.sock", "address": "10.244.200.1",
		"registerNode": false, "resolvConf": "", "staticPodPath": filepath.Join(dir, "manifests"),
	} {
		if kc[key] != want {
			t.Errorf("kubelet config %s = %v, want %v", key, kc[key], want)
		}
	}
}

// TestRealNodeJoinedKubeletConfig: with a kubeconfig the kubelet registers
// and its API asks the API server who may call it.
func TestRealNodeJoinedKubeletConfig(t *testing.T) {
	dir := t.TempDir()
	o := RealNodeOptions{Name: "real-a", Dir: dir, RunDir: "/run/sccl-real-a", PodCIDR: netip.MustParsePrefix("10.244.200.0/24"),
		CgroupParent: "sockscale-cluster/real-a", Kubeconfig: "/pki/real-a.kubeconfig", ClientCAFile: "/pki/ca.crt",
		ClusterDNS: []netip.Addr{HostIP}}
	p := realNodePaths{dir: dir}
	if err := o.writeKubeletConfig(p); err != nil {
		t.Fatal(err)
	}
	var kc struct {
		RegisterNode   bool     `json:"registerNode"`
		ClusterDNS     []string `json:"clusterDNS"`
		Authentication struct {
			Anonymous struct{ Enabled bool } `json:"anonymous"`
			Webhook   struct{ Enabled bool } `json:"webhook"`
			X509      struct {
				ClientCAFile string `json:"clientCAFile"`
			} `json:"x509"`
		} `json:"authentication"`
		Authorization struct{ Mode string } `json:"authorization"`
	}
	if err := yaml.Unmarshal([]byte(readText(t, p.kubeletConfig())), &kc); err != nil {
		t.Fatal(err)
	}
	a := kc.Authentication
	if !kc.RegisterNode || a.Anonymous.Enabled || !a.Webhook.Enabled || a.X509.ClientCAFile != "/pki/ca.crt" ||
		kc.Authorization.Mode != "Webhook" || len(kc.ClusterDNS) != 1 || kc.ClusterDNS[0] != HostIP.String() {
		t.Errorf("joined kubelet config: %+v", kc)
	}
}

func readText(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
