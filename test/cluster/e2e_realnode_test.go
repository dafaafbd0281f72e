package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sockscale/sockscale/internal/imagebuild"
	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
	"github.com/sockscale/sockscale/internal/testutil/localroute"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// The standalone real node's fixed names, apart from a running cluster's:
// its own registry port, bridge, pod range and cgroup.
const (
	realTestRegistry = "127.0.0.1:12490"
	realTestBridge   = Prefix + "-real0"
	realTestNode     = "real-a"
	// realTestHostPort is the pod's hostPort on the node's address.
	realTestHostPort = 12491
)

var realTestCIDR = netip.MustParsePrefix("10.244.200.0/24")

// TestE2ERealNodeStandalone runs a real kubelet and containerd with no API
// server: a static pod (the pause sandbox from our registry, the autoscale
// app) must run, answer on its pod IP and pass the kubelet's readiness
// probe; stopping the node must leave nothing behind.
func TestE2ERealNodeStandalone(t *testing.T) {
	testenv.RequireRoot(t)
	binDir := DefaultKubeBinDir()
	for _, b := range append(RealNodeBinaries, "cni/bridge", "cni/host-local", "cni/loopback", "cni/portmap") {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s missing (run make real-node-binaries); CI=true forbids skipping", b)
			}
			t.Skipf("%s missing: run make real-node-binaries", b)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	dir := filepath.Join(os.TempDir(), "sockscale-realnode")
	regCtx, stopReg := context.WithCancel(ctx)
	regDone := make(chan error, 1)
	go func() { regDone <- ServeRegistry(regCtx, realTestRegistry, filepath.Join(dir, "registry")) }()
	defer func() {
		stopReg()
		if err := <-regDone; err != nil {
			t.Errorf("registry: %v", err)
		}
	}()
	if err := waitHTTP(ctx, "http://"+realTestRegistry+"/v2/", "", nil, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	images, err := pushRealNodeImages(ctx, realTestRegistry+"/sockscale")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pause and autoscale built and pushed in %s", time.Since(start).Round(100*time.Millisecond))

	start = time.Now()
	chainsBefore := nodeChains(t)
	node, err := StartRealNode(ctx, RealNodeOptions{
		Name: realTestNode, Dir: filepath.Join(dir, realTestNode), BinDir: binDir,
		PodCIDR: realTestCIDR, Bridge: realTestBridge, SandboxImage: images["pause"],
		PlainHTTPRegistries: []string{realTestRegistry},
		CgroupParent:        "sockscale-realnode/" + realTestNode,
		KubeletPort:         10250, HealthzPort: 12448,
	})
	stopped := false
	defer func() {
		if !stopped {
			if err := StopRealNode(filepath.Join(dir, realTestNode)); err != nil {
				t.Errorf("stop: %v", err)
			}
		}
	}()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("containerd and kubelet up in %s (logs in %s)", time.Since(start).Round(100*time.Millisecond), node.LogDir())

	start = time.Now()
	manifest := fmt.Sprintf(realTestPod, images["autoscale"], realTestCIDR.Addr().Next(), realTestHostPort)
	if err := os.WriteFile(filepath.Join(node.Options().StaticPodDir, "app.yaml"), []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	var pod corev1.Pod
	if err := poll(ctx, 90*time.Second, func() error {
		p, err := kubeletPod(ctx, node, "app-"+realTestNode)
		if err != nil {
			return err
		}
		pod = p
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("pod not ready: phase %s, conditions %v, containers %v", p.Status.Phase, p.Status.Conditions, p.Status.ContainerStatuses)
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("static pod ready in %s: IP %s", time.Since(start).Round(100*time.Millisecond), pod.Status.PodIP)

	// runc on a hybrid host puts a container in the cgroup v2 hierarchy too
	// (beside every v1 one), below the node's cgroup: where the agent
	// attaches its programs on a joined node.
	if len(pod.Status.ContainerStatuses) != 1 {
		t.Fatalf("container statuses: %+v", pod.Status.ContainerStatuses)
	}
	v2, err := cgroup2.Root()
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	procs := filepath.Join(v2, node.Options().CgroupParent, "kubepods", "besteffort", "pod"+string(pod.UID), id, "cgroup.procs")
	if b, err := os.ReadFile(procs); err != nil || strings.TrimSpace(string(b)) == "" {
		t.Errorf("the container is not in its cgroup v2 %s: %q %v", procs, b, err)
	}

	ip, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil || !realTestCIDR.Contains(ip) {
		t.Fatalf("pod IP %q: not in %s (%v)", pod.Status.PodIP, realTestCIDR, err)
	}
	// Nothing is sent before the route says the address is on our bridge.
	if err := localroute.Check(ip, localroute.Dev(realTestBridge)); err != nil {
		t.Fatal(err)
	}
	body, err := httpGet(ctx, fmt.Sprintf("http://%s:8080/", ip))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("GET / from the host: %s", strings.TrimSpace(body))
	// The hostPort, through portmap's DNAT, on the node's address only.
	gw := node.Options().PodCIDR.Addr().Next()
	if err := localroute.Check(gw, localroute.Local()); err != nil {
		t.Fatal(err)
	}
	if _, err := httpGet(ctx, fmt.Sprintf("http://%s:%d/healthz", gw, realTestHostPort)); err != nil {
		t.Fatalf("hostPort: %v", err)
	}

	// For a look at a running node (cgroups, mounts, rules); the next
	// start or StopRealNode removes it.
	if os.Getenv("SOCKSCALE_REALNODE_KEEP") == "1" {
		stopped = true
		t.Logf("SOCKSCALE_REALNODE_KEEP=1: node left running, state in %s", node.Options().Dir)
		return
	}
	stopped = true
	start = time.Now()
	if err := node.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	t.Logf("stopped in %s", time.Since(start).Round(100*time.Millisecond))
	checkRealNodeGone(t, node.Options())
	for _, c := range nodeChains(t) {
		if !slices.Contains(chainsBefore, c) {
			t.Errorf("iptables chain %s left by the node", c)
		}
	}
}

// nodeChains are the iptables chains, "table/chain", that a node's
// kubelet (KUBE-KUBELET-CANARY, KUBE-FIREWALL, KUBE-IPTABLES-HINT) or CNI
// plugins (CNI-*)
// would make; a running cluster's kube-proxy changes only its own.
func nodeChains(t *testing.T) []string {
	t.Helper()
	var chains []string
	for _, table := range []string{"filter", "nat", "mangle"} {
		out, err := output("iptables", "-w", "-t", table, "-S")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(out, "\n") {
			name, ok := strings.CutPrefix(line, "-N ")
			if ok && (name == "KUBE-KUBELET-CANARY" || name == "KUBE-FIREWALL" || name == "KUBE-IPTABLES-HINT" || strings.HasPrefix(name, "CNI-")) {
				chains = append(chains, table+"/"+name)
			}
		}
	}
	return chains
}

// realTestPod is the static pod: the autoscale app on port 8080, ready
// when its /healthz says so (probed by the kubelet from the host), with a
// hostPort on the node's address (never on the host's other addresses).
const realTestPod = `apiVersion: v1
kind: Pod
metadata:
  name: app
  namespace: default
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: app
    image: %s
    args: ["--port", "8080"]
    ports:
    - containerPort: 8080
      hostIP: %s
      hostPort: %d
    readinessProbe:
      httpGet: {path: /healthz, port: 8080}
      periodSeconds: 1
`

// pushRealNodeImages builds the pause and autoscale images and pushes them
// to repo; it returns their references by name.
func pushRealNodeImages(ctx context.Context, repo string) (map[string]string, error) {
	root := filepath.Join("..", "..")
	epoch, err := imagebuild.SourceDateEpoch(ctx, root)
	if err != nil {
		return nil, err
	}
	var specs []imagebuild.Spec
	for _, s := range imagebuild.Images {
		if s.Name == "pause" || s.Name == "autoscale" {
			specs = append(specs, s)
		}
	}
	built, err := imagebuild.Build(ctx, imagebuild.Options{Dir: root, Epoch: epoch}, specs)
	if err != nil {
		return nil, err
	}
	if _, err := imagebuild.Push(ctx, built, repo, "realnode"); err != nil {
		return nil, err
	}
	refs := map[string]string{}
	for _, b := range built {
		refs[b.Name] = repo + "/" + b.Name + ":realnode"
	}
	return refs, nil
}

// kubeletPod reads a pod's status from the kubelet API's /pods, over TLS
// with the kubelet's self-signed certificate.
func kubeletPod(ctx context.Context, n *RealNode, name string) (corev1.Pod, error) {
	o := n.Options()
	caPEM, err := os.ReadFile(filepath.Join(n.paths.kubeletRoot(), "pki", "kubelet.crt"))
	if err != nil {
		return corev1.Pod{}, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	// The certificate names the node, not its address.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: o.Name}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://%s:%d/pods", o.gateway(), o.KubeletPort), nil)
	if err != nil {
		return corev1.Pod{}, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return corev1.Pod{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return corev1.Pod{}, fmt.Errorf("kubelet /pods: %s: %s", resp.Status, b)
	}
	var list corev1.PodList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return corev1.Pod{}, fmt.Errorf("kubelet /pods: %w", err)
	}
	for _, p := range list.Items {
		if p.Name == name {
			return p, nil
		}
	}
	return corev1.Pod{}, fmt.Errorf("kubelet /pods: no pod %s yet", name)
}

func httpGet(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return string(b), nil
}

// checkRealNodeGone fails t for anything of the node left on the host.
func checkRealNodeGone(t *testing.T, o RealNodeOptions) {
	t.Helper()
	if _, err := os.Stat(filepath.Join("/sys/class/net", o.Bridge)); err == nil {
		t.Errorf("bridge %s left", o.Bridge)
	}
	for _, d := range []string{o.Dir, o.RunDir} {
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), " "+d+"/") {
			t.Errorf("mounts left below %s", d)
		}
	}
	dirs, err := nodeCgroupDirs(o.CgroupParent)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup %s left", d)
		}
	}
	if _, err := os.Stat(o.RunDir); err == nil {
		t.Errorf("%s left", o.RunDir)
	}
	if _, err := os.Stat("/var/lib/kubelet/device-plugins/kubelet.sock"); err == nil {
		t.Error("the kubelet's device-plugin socket left")
	}
	logLinks, _ := os.ReadDir("/var/log/containers")
	for _, e := range logLinks {
		if target, err := os.Readlink(filepath.Join("/var/log/containers", e.Name())); err == nil && strings.HasPrefix(target, o.Dir+"/") {
			t.Errorf("/var/log/containers/%s left", e.Name())
		}
	}
	nat, err := output("iptables", "-w", "-t", "nat", "-S")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(nat, fmt.Sprintf(`dnat name: \"%s\"`, o.Bridge)) || strings.Contains(nat, "CNI-DN-") {
		t.Errorf("portmap rules left:\n%s", nat)
	}
	if links, err := output("ip", "-o", "link", "show", "master", o.Bridge); err == nil && links != "" {
		t.Errorf("links left on %s: %s", o.Bridge, links)
	}
}

// TestE2ERealNodeJoined: the cluster's real node is Ready, tainted and
// labelled for its agent pool; a pod that tolerates the taint runs there
// in a real container (the kubelet's readiness probe passes), gets an
// address of the node's range, and talks with the rest of the cluster
// both ways: ClusterIP and DNS from the real pod to a simulated node's
// pod, pod to pod back; its logs come through the API server from the
// real kubelet.
func TestE2ERealNodeJoined(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	name := RealNodeName(0)
	node, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if nodeReady(node) != corev1.ConditionTrue || node.Status.NodeInfo.ContainerRuntimeVersion != "containerd://2.4.2" ||
		node.Labels[AgentPoolLabel] != name || !slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == RealNodeTaint }) {
		t.Fatalf("node %s: ready %s, runtime %q, labels %v, taints %v", name, nodeReady(node), node.Status.NodeInfo.ContainerRuntimeVersion, node.Labels, node.Spec.Taints)
	}

	onSim := createReadyPod(t, c, echoPod("joined-sim", map[string]string{"app": "joined-sim"}))
	svc, err := c.Client.CoreV1().Services(e2eNS).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "joined-sim", Namespace: e2eNS},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "joined-sim"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	real := echoPod("joined-real", nil)
	real.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": name}
	real.Spec.Tolerations = []corev1.Toleration{{Key: RealNodeTaint, Operator: corev1.TolerationOpExists}}
	start := time.Now()
	got := createReadyPod(t, c, real)
	t.Logf("pod on %s ready in %s: %s", name, time.Since(start).Round(100*time.Millisecond), got.Status.PodIP)
	ip, err := netip.ParseAddr(got.Status.PodIP)
	if err != nil || !RealNodeCIDR(0).Contains(ip) || got.Status.HostIP != RealNodeIP(0).String() {
		t.Fatalf("pod IP %q host IP %q: want in %s on %s", got.Status.PodIP, got.Status.HostIP, RealNodeCIDR(0), RealNodeIP(0))
	}
	if id := got.Status.ContainerStatuses[0].ContainerID; !strings.HasPrefix(id, "containerd://") {
		t.Errorf("container ID %q: not containerd's", id)
	}
	if err := localroute.Check(ip, localroute.Dev(NodeBridge(name))); err != nil {
		t.Fatal(err)
	}
	from := "http://" + got.Status.PodIP + ":8080"
	if body, err := get(from + "/env?name=NODE_NAME"); err != nil || body != name {
		t.Errorf("the real pod's env: %q, %v", body, err)
	}
	eventually(t, 30*time.Second, "Service by name from the real pod", func() error {
		body, err := get(from + "/get?url=http://joined-sim/")
		if err == nil && !strings.HasPrefix(body, "pod=joined-sim") {
			err = fmt.Errorf("answer %q", body)
		}
		return err
	})
	if body, err := get(from + "/resolve?name=joined-sim." + e2eNS + ".svc.cluster.local"); err != nil || strings.TrimSpace(body) != svc.Spec.ClusterIP {
		t.Errorf("resolve from the real pod: %q, %v; want %s", body, err, svc.Spec.ClusterIP)
	}
	simFrom := "http://" + onSim.Status.PodIP + ":8080"
	if body, err := get(simFrom + "/get?url=http://" + got.Status.PodIP + ":8080/"); err != nil || !strings.Contains(body, "joined-real") {
		t.Errorf("simulated pod to the real pod: %q, %v", body, err)
	}
	logs, err := c.Client.CoreV1().Pods(e2eNS).GetLogs("joined-real", &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil || len(logs) == 0 {
		t.Errorf("logs of the real pod through the API server: %q, %v", logs, err)
	}
	for _, p := range []string{"joined-real", "joined-sim"} {
		deleteAndWaitGone(t, c, p)
	}
	if err := c.Client.CoreV1().Services(e2eNS).Delete(ctx, "joined-sim", metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
}
