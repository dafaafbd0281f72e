package cluster

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

func TestContainerCaps(t *testing.T) {
	sc := func(add, drop []corev1.Capability) *corev1.SecurityContext {
		return &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: add, Drop: drop}}
	}
	tests := []struct {
		name string
		sc   *corev1.SecurityContext
		want []int
	}{
		{"default", nil, []int{0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 27, 29, 31}},
		{"drop all add bpf", sc([]corev1.Capability{"BPF", "CAP_NET_ADMIN", "PERFMON"}, []corev1.Capability{"ALL"}), []int{12, 38, 39}},
		{"drop one", sc(nil, []corev1.Capability{"NET_RAW", "KILL", "CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "SETGID", "SETUID", "SETFCAP", "SETPCAP", "SYS_CHROOT", "AUDIT_WRITE"}), []int{10}},
	}
	for _, tt := range tests {
		got, err := containerCaps(tt.sc)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("%s: caps (-want +got):\n%s", tt.name, diff)
		}
	}
	all, err := containerCaps(&corev1.SecurityContext{Privileged: ptr.To(true)})
	if err != nil || len(all) != lastCap()+1 {
		t.Errorf("privileged: %d caps, %v; want %d", len(all), err, lastCap()+1)
	}
	if _, err := containerCaps(sc([]corev1.Capability{"FLY"}, nil)); err == nil {
		t.Error("unknown capability: no error")
	}
}

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "1", "NODE": "node-a"}
	for in, want := range map[string]string{
		"--node=$(NODE)": "--node=node-a",
		"$(A)$(B)":       "1$(B)",
		"$$(A)":          "$(A)",
		"plain $":        "plain $",
	} {
		if got := expand(in, vars); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNodeNames(t *testing.T) {
	for i := 0; i < 3; i++ {
		if got := NodeIndex(NodeName(i)); got != i {
			t.Errorf("NodeIndex(NodeName(%d)) = %d", i, got)
		}
	}
	if NodeCIDR(1).String() != "10.244.2.0/24" || NodeIP(1).String() != "10.244.2.1" {
		t.Errorf("node 1: %s %s", NodeCIDR(1), NodeIP(1))
	}
}

func TestHostPathTranslation(t *testing.T) {
	state := t.TempDir()
	w := &podWorker{s: &sim{cgroupRoot: "/sys/fs/cgroup/unified", opts: SimOptions{StateDir: state}}, node: &simNode{name: "node-b", index: 1}}
	node := "/sys/fs/cgroup/unified/sockscale-cluster/node-b"
	typ := func(t corev1.HostPathType) *corev1.HostPathType { return &t }
	tests := []struct {
		path    string
		typ     *corev1.HostPathType
		want    string
		wantErr bool
	}{
		{path: "/sys/fs/cgroup/unified", want: node},
		{path: "/sys/fs/cgroup/unified/", want: node},
		{path: "/sys/fs/cgroup", want: node},
		{path: "/sys/fs/cgroup/kubepods", want: node + "/kubepods"},
		{path: "/proc", want: "/proc"},
		{path: "/var/lib/no-such-e2e-dir", typ: typ(corev1.HostPathDirectoryOrCreate), want: state + "/nodes/node-b/root/var/lib/no-such-e2e-dir"},
		{path: "/var/lib/no-such-e2e-file", typ: typ(corev1.HostPathFileOrCreate), want: state + "/nodes/node-b/root/var/lib/no-such-e2e-file"},
		{path: "/var/lib/no-such-e2e-dir2", typ: typ(corev1.HostPathDirectory), wantErr: true},
	}
	for _, tt := range tests {
		got, err := w.hostPath(&corev1.HostPathVolumeSource{Path: tt.path, Type: tt.typ})
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("hostPath(%s) = %q, %v; want %q (error: %v)", tt.path, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestPodMACFollowsTheIP(t *testing.T) {
	if got, want := podMAC(netip.MustParseAddr("10.244.1.7")).String(), "0a:58:0a:f4:01:07"; got != want {
		t.Errorf("podMAC = %s, want %s", got, want)
	}
}

func TestIPv6Ranges(t *testing.T) {
	for i := 0; i < 26; i++ {
		cidr := NodeCIDR6(i)
		if !ClusterCIDR6.Contains(cidr.Addr()) || cidr.Bits() != 64 {
			t.Errorf("NodeCIDR6(%d) = %s, not a /64 of %s", i, cidr, ClusterCIDR6)
		}
		if cidr.Contains(HostIP6) {
			t.Errorf("NodeCIDR6(%d) = %s holds HostIP6", i, cidr)
		}
		if ip := PodIP6(i, NodeIP(i)); ip != NodeIP6(i) {
			t.Errorf("PodIP6(%d, NodeIP) = %s, want NodeIP6 %s", i, ip, NodeIP6(i))
		}
	}
	for i := range maxRealNodes {
		real := RealNodeCIDR6(i)
		if !ClusterCIDR6.Contains(real.Addr()) || real.Contains(HostIP6) {
			t.Errorf("RealNodeCIDR6(%d) = %s: not a range of its own in %s", i, real, ClusterCIDR6)
		}
		for j := range 26 {
			if real.Overlaps(NodeCIDR6(j)) {
				t.Errorf("RealNodeCIDR6(%d) = %s overlaps NodeCIDR6(%d)", i, real, j)
			}
		}
	}
	if got, want := RealNodeCIDR6(0).String(), "fd5c:a1e:0:64::/64"; got != want {
		t.Errorf("RealNodeCIDR6(0) = %s, want %s", got, want)
	}
	if got, want := NodeCIDR6(1).String(), "fd5c:a1e:0:2::/64"; got != want {
		t.Errorf("NodeCIDR6(1) = %s, want %s", got, want)
	}
	if got, want := PodIP6(0, netip.MustParseAddr("10.244.1.7")).String(), "fd5c:a1e:0:1::7"; got != want {
		t.Errorf("PodIP6 = %s, want %s", got, want)
	}
	if ClusterCIDR6.Overlaps(ServiceCIDR6) {
		t.Errorf("%s overlaps %s", ClusterCIDR6, ServiceCIDR6)
	}
	for _, p := range []netip.Prefix{ClusterCIDR6, ServiceCIDR6} {
		// Unique local (fd00::/8), and not the machine's own fd00::/64.
		if !netip.MustParsePrefix("fd00::/8").Contains(p.Addr()) || p.Overlaps(netip.MustParsePrefix("fd00::/64")) {
			t.Errorf("%s is not a unique local range of ours", p)
		}
	}
}
