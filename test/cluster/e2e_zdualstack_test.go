package cluster

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/internal/testutil/localroute"
)

// TestE2EZDualStack runs a dual-stack cluster (Options.DualStack) of its
// own, after TestE2EZDown has stopped the shared one (only one cluster runs
// on a machine at a time; files and tests run in name order). Its cases
// share the cluster. Every address is sent to only after the host's route
// to it was checked to be one of ours: the machine's IPv6 default route
// leads off it.
func TestE2EZDualStack(t *testing.T) {
	requireClusterHost(t)
	if e2eCluster != nil && !e2eDown {
		// Run on its own with some of the shared cluster's tests (-run):
		// its lock would keep this Up waiting.
		if err := e2eCluster.Down(); err != nil {
			t.Fatalf("down the shared cluster: %v", err)
		}
		e2eDown = true
	}
	ctx := context.Background()
	eth0Before := hostIPv6Config(t)
	rulesBefore := ruleset(t)
	opts := Options{Nodes: 2, RealNodes: 1, DualStack: true, StateDir: filepath.Join(os.TempDir(), "sockscale-cluster-dualstack")}
	start := time.Now()
	c, err := Up(ctx, opts)
	if err != nil {
		if c != nil {
			_ = c.Down()
		}
		t.Fatalf("cluster up: %v", err)
	}
	t.Logf("dual-stack cluster up in %s", time.Since(start).Round(100*time.Millisecond))
	downed := false
	t.Cleanup(func() {
		if !downed {
			_ = c.Down()
		}
	})
	start = time.Now()
	if err := pushTestImages(ctx, testImages[:1]); err != nil {
		t.Fatalf("push echo: %v", err)
	}
	t.Logf("echo built and pushed in %s", time.Since(start).Round(100*time.Millisecond))

	t.Run("ForwardingLeavesEth0Alone", func(t *testing.T) {
		if got := sysctl(t, "net/ipv6/conf/all/forwarding"); got != "1" {
			t.Errorf("net.ipv6.conf.all.forwarding = %s while the cluster runs, want 1", got)
		}
		if got := hostIPv6Config(t); got != eth0Before {
			t.Errorf("eth0's IPv6 addresses or routes changed:\nbefore:\n%s\nnow:\n%s", eth0Before, got)
		}
	})

	const ns = "dualstack"
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "default ServiceAccount of "+ns, func() error {
		_, err := c.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	labels := map[string]string{"app": "echo6"}
	var pods []*corev1.Pod
	for i := range 2 {
		name := fmt.Sprintf("echo6-%d", i)
		p := echoPod(name, map[string]string{"app": "echo6", "pod": name})
		p.Namespace, p.Spec.NodeName = ns, NodeName(i)
		p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "POD_IPS",
			ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIPs"}}})
		pods = append(pods, createReadyPod(t, c, p))
	}
	dualStackService := func(name string, selector map[string]string) *corev1.Service {
		t.Helper()
		svc, err := c.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.ServiceSpec{Selector: selector, IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack),
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create a RequireDualStack Service: %v", err)
		}
		return svc
	}
	svc := dualStackService("echo6", labels)
	// One per pod: a pod's client keeps its connection (and so its
	// backend) from one request to the next, so which path a request to
	// a Service of both pods takes is chance.
	onePod := []*corev1.Service{dualStackService("echo6-0", map[string]string{"pod": "echo6-0"}),
		dualStackService("echo6-1", map[string]string{"pod": "echo6-1"})}

	t.Run("NodesHaveBothRanges", func(t *testing.T) {
		for i := range 2 {
			n, err := c.Client.CoreV1().Nodes().Get(ctx, NodeName(i), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if want := []string{NodeCIDR(i).String(), NodeCIDR6(i).String()}; !slices.Equal(n.Spec.PodCIDRs, want) {
				t.Errorf("%s: podCIDRs %v, want %v", n.Name, n.Spec.PodCIDRs, want)
			}
			var internal []string
			for _, a := range n.Status.Addresses {
				if a.Type == corev1.NodeInternalIP {
					internal = append(internal, a.Address)
				}
			}
			if want := []string{NodeIP(i).String(), NodeIP6(i).String()}; !slices.Equal(internal, want) {
				t.Errorf("%s: InternalIPs %v, want %v", n.Name, internal, want)
			}
		}
	})

	// pod i's IPv6 address, checked to be of its node's range.
	podIP6 := make([]netip.Addr, len(pods))
	t.Run("PodIPs", func(t *testing.T) {
		for i, p := range pods {
			if len(p.Status.PodIPs) != 2 {
				t.Fatalf("%s: podIPs %v, want an IPv4 and an IPv6 address", p.Name, p.Status.PodIPs)
			}
			v4, err4 := netip.ParseAddr(p.Status.PodIPs[0].IP)
			v6, err6 := netip.ParseAddr(p.Status.PodIPs[1].IP)
			if err4 != nil || err6 != nil || !NodeCIDR(i).Contains(v4) || !NodeCIDR6(i).Contains(v6) {
				t.Fatalf("%s on %s: podIPs %v, want one of %s then one of %s", p.Name, p.Spec.NodeName, p.Status.PodIPs, NodeCIDR(i), NodeCIDR6(i))
			}
			if p.Status.PodIP != v4.String() {
				t.Errorf("%s: podIP %s, want the IPv4 one %s", p.Name, p.Status.PodIP, v4)
			}
			podIP6[i] = v6
			// The downward API's list, as the pod sees it.
			body, err := get("http://" + net.JoinHostPort(v4.String(), "8080") + "/env?name=POD_IPS")
			if want := v4.String() + "," + v6.String(); err != nil || body != want {
				t.Errorf("%s: POD_IPS %q, %v; want %q", p.Name, body, err, want)
			}
		}
	})
	if !podIP6[1].IsValid() {
		t.Fatal("no IPv6 pod address to go on with")
	}

	var svcIP6 netip.Addr
	t.Run("ServiceHasBothClusterIPs", func(t *testing.T) {
		if len(svc.Spec.ClusterIPs) != 2 {
			t.Fatalf("clusterIPs %v, want two", svc.Spec.ClusterIPs)
		}
		v4, err4 := netip.ParseAddr(svc.Spec.ClusterIPs[0])
		v6, err6 := netip.ParseAddr(svc.Spec.ClusterIPs[1])
		if err4 != nil || err6 != nil || !ServiceCIDR.Contains(v4) || !ServiceCIDR6.Contains(v6) {
			t.Fatalf("clusterIPs %v, want one of %s then one of %s", svc.Spec.ClusterIPs, ServiceCIDR, ServiceCIDR6)
		}
		if want := []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}; !slices.Equal(svc.Spec.IPFamilies, want) {
			t.Errorf("ipFamilies %v, want %v", svc.Spec.IPFamilies, want)
		}
		svcIP6 = v6
	})
	if !svcIP6.IsValid() {
		t.Fatal("no IPv6 ClusterIP to go on with")
	}

	// The IPv6 ClusterIP of each pod's own Service.
	podSvcIP6 := make([]netip.Addr, len(onePod))
	for i, s := range onePod {
		if len(s.Spec.ClusterIPs) != 2 {
			t.Fatalf("Service %s: clusterIPs %v, want two", s.Name, s.Spec.ClusterIPs)
		}
		podSvcIP6[i] = netip.MustParseAddr(s.Spec.ClusterIPs[1])
	}

	// Nothing is sent to an address before its route is known to be ours.
	for _, ip := range []netip.Addr{podIP6[0], podIP6[1], svcIP6, podSvcIP6[0], podSvcIP6[1], HostIP6} {
		r, err := localroute.Get(ip)
		if err != nil {
			t.Fatal(err)
		}
		if err := localroute.Check(ip, localroute.DevPrefix(Prefix), localroute.Local()); err != nil || r.Dev == "eth0" || r.Gateway.IsValid() {
			t.Fatalf("route to %s: %s (%v); refusing to send to it", ip, r, err)
		}
		t.Logf("route: %s", r)
	}
	url6 := func(ip netip.Addr, port int) string {
		return "http://" + net.JoinHostPort(ip.String(), fmt.Sprint(port))
	}
	from := url6(podIP6[0], 8080) // pod 0, over IPv6 too

	t.Run("PodIPv6FromTheHost", func(t *testing.T) {
		body, err := get(url6(podIP6[1], 8080) + "/")
		if err != nil || !strings.HasPrefix(body, "pod="+pods[1].Name+" ") {
			t.Errorf("GET pod %s at %s: %q, %v", pods[1].Name, podIP6[1], body, err)
		}
	})

	t.Run("PodToPodIPv6AcrossNodes", func(t *testing.T) {
		// Routed by the host from node-a's bridge to node-b's.
		body, err := get(from + "/get?url=" + url6(podIP6[1], 8080) + "/")
		if err != nil || !strings.HasPrefix(body, "pod="+pods[1].Name+" ") {
			t.Errorf("from %s to %s: %q, %v", pods[0].Name, podIP6[1], body, err)
		}
	})

	t.Run("ClusterIPv6", func(t *testing.T) {
		// kube-proxy's ip6tables rules, from the host: both pods answer.
		seen := map[string]bool{}
		eventually(t, 30*time.Second, "both pods answer the IPv6 ClusterIP from the host", func() error {
			body, err := get(url6(svcIP6, 80) + "/")
			if err != nil {
				return err
			}
			seen[strings.Fields(body)[0]] = true
			if len(seen) < 2 {
				return fmt.Errorf("answers from %v", seen)
			}
			return nil
		})
		// From pod 0: to pod 1 on the other node (DNAT, then routed by
		// the host), and to itself (hairpin through its bridge, un-DNATed
		// thanks to bridge-nf-call-ip6tables).
		for i, ip := range podSvcIP6 {
			var body string
			eventually(t, 30*time.Second, "the IPv6 ClusterIP of "+onePod[i].Name+" from a pod", func() error {
				var err error
				body, err = get(from + "/get?url=" + url6(ip, 80) + "/")
				return err
			})
			if !strings.HasPrefix(body, "pod="+pods[i].Name+" ") {
				t.Errorf("%s's IPv6 ClusterIP %s from %s: answered %q, want %s", onePod[i].Name, ip, pods[0].Name, body, pods[i].Name)
			}
		}
	})

	t.Run("RealNode", func(t *testing.T) {
		name := RealNodeName(0)
		n, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{RealNodeCIDR(0).String(), RealNodeCIDR6(0).String()}; !slices.Equal(n.Spec.PodCIDRs, want) {
			t.Errorf("%s: podCIDRs %v, want %v", name, n.Spec.PodCIDRs, want)
		}
		var internal []string
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				internal = append(internal, a.Address)
			}
		}
		if want := []string{RealNodeIP(0).String(), RealNodeIP6(0).String()}; !slices.Equal(internal, want) {
			t.Errorf("%s: InternalIPs %v, want %v (the kubelet's --node-ip)", name, internal, want)
		}
		p := echoPod("echo6-real", nil)
		p.Namespace = ns
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": name}
		p.Spec.Tolerations = []corev1.Toleration{{Key: RealNodeTaint, Operator: corev1.TolerationOpExists}}
		start := time.Now()
		p = createReadyPod(t, c, p)
		t.Logf("pod on %s ready in %s: %v", name, time.Since(start).Round(100*time.Millisecond), p.Status.PodIPs)
		// Both from the CNI bridge plugin's host-local IPAM, IPv4 first.
		if len(p.Status.PodIPs) != 2 {
			t.Fatalf("podIPs %v, want an IPv4 and an IPv6 address", p.Status.PodIPs)
		}
		v4, err4 := netip.ParseAddr(p.Status.PodIPs[0].IP)
		v6, err6 := netip.ParseAddr(p.Status.PodIPs[1].IP)
		if err4 != nil || err6 != nil || !RealNodeCIDR(0).Contains(v4) || !RealNodeCIDR6(0).Contains(v6) {
			t.Fatalf("podIPs %v, want one of %s then one of %s", p.Status.PodIPs, RealNodeCIDR(0), RealNodeCIDR6(0))
		}
		if err := localroute.Check(v6, localroute.Dev(NodeBridge(name))); err != nil {
			t.Fatal(err)
		}
		real := url6(v6, 8080)
		// A simulated node's pod to the real one, and the real one (its
		// routes to the cluster's IPv6 ranges) to a Service's IPv6
		// ClusterIP and to the simulated pod behind it.
		if body, err := get(from + "/get?url=" + real + "/"); err != nil || !strings.HasPrefix(body, "pod=echo6-real ") {
			t.Errorf("from %s to the real pod at %s: %q, %v", pods[0].Name, v6, body, err)
		}
		eventually(t, 30*time.Second, "an IPv6 ClusterIP from the real pod", func() error {
			body, err := get(real + "/get?url=" + url6(podSvcIP6[1], 80) + "/")
			if err == nil && !strings.HasPrefix(body, "pod="+pods[1].Name+" ") {
				err = fmt.Errorf("answer %q", body)
			}
			return err
		})
		if body, err := get(real + "/get?url=" + url6(podIP6[0], 8080) + "/"); err != nil || !strings.HasPrefix(body, "pod="+pods[0].Name+" ") {
			t.Errorf("from the real pod to %s at %s: %q, %v", pods[0].Name, podIP6[0], body, err)
		}
	})

	t.Run("DNS", func(t *testing.T) {
		name := "echo6." + ns + ".svc." + ClusterDomain
		ips, err := Resolver().LookupNetIP(ctx, "ip6", name)
		if err != nil || !slices.Contains(ips, svcIP6) {
			t.Errorf("AAAA %s from the host: %v, %v; want %s", name, ips, err, svcIP6)
		}
		// Over IPv6 to the DNS as well: it listens on HostIP6.
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, net.JoinHostPort(HostIP6.String(), fmt.Sprint(DNSPort)))
		}}
		if ips, err := r.LookupNetIP(ctx, "ip6", name); err != nil || !slices.Contains(ips, svcIP6) {
			t.Errorf("AAAA %s asked at %s: %v, %v; want %s", name, HostIP6, ips, err, svcIP6)
		}
		// In a pod, by the search path: both families.
		body, err := get(from + "/resolve?name=echo6")
		if err != nil || !strings.Contains(body, svc.Spec.ClusterIPs[0]) || !strings.Contains(body, svcIP6.String()) {
			t.Errorf("resolve echo6 in a pod: %q, %v; want %v", body, err, svc.Spec.ClusterIPs)
		}
	})

	// Down leaves the host as it was: routes, rules, sysctls, eth0.
	if err := c.Down(); err != nil {
		t.Fatalf("down: %v", err)
	}
	downed = true
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		if routeInRanges(r, ClusterCIDR6, ServiceCIDR6) {
			t.Errorf("route left: %s", r)
		}
	}
	if got := ruleset(t); got != rulesBefore {
		t.Errorf("iptables/ip6tables rules differ after down:\nbefore:\n%s\nafter:\n%s", rulesBefore, got)
	}
	if got := hostIPv6Config(t); got != eth0Before {
		t.Errorf("eth0's IPv6 addresses or routes changed after down:\nbefore:\n%s\nnow:\n%s", eth0Before, got)
	}
	for key, old := range c.state.Sysctls {
		if got := sysctl(t, key); got != old {
			t.Errorf("sysctl %s = %s after down, want %s", key, got, old)
		}
	}
}

// hostIPv6Config is eth0's IPv6 addresses and the host's IPv6 routes
// through it, one a line.
func hostIPv6Config(t *testing.T) string {
	t.Helper()
	eth0, err := netlink.LinkByName("eth0")
	if err != nil {
		t.Skipf("no eth0 to watch: %v", err)
	}
	addrs, err := netlink.AddrList(eth0, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	routes, err := netlink.RouteList(eth0, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, a := range addrs {
		lines = append(lines, fmt.Sprintf("addr %s flags %#x", a.IPNet, a.Flags))
	}
	for _, r := range routes {
		lines = append(lines, "route "+r.String())
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// ruleset is iptables' and ip6tables' filter, nat and mangle rules.
func ruleset(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, ipt := range []string{"iptables", "ip6tables"} {
		for _, table := range []string{"filter", "nat", "mangle"} {
			out, err := output(ipt, "-w", "-t", table, "-S")
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%s -t %s:\n%s", ipt, table, out)
		}
	}
	return b.String()
}

func sysctl(t *testing.T, key string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc/sys", key))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
