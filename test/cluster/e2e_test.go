package cluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/internal/imagebuild"
	"github.com/sockscale/sockscale/internal/testutil/localroute"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// The e2e tests share one cluster, started by the first of them and
// stopped by TestMain (TestE2EZDown stops it first and checks nothing of
// it is left).
var (
	e2eOnce    sync.Once
	e2eCluster *Cluster
	e2eErr     error
	e2eDown    bool
)

func TestMain(m *testing.M) {
	code := m.Run()
	if e2eCluster != nil && !e2eDown {
		if err := e2eCluster.Down(); err != nil {
			fmt.Fprintln(os.Stderr, "down:", err)
			code = 1
		}
	}
	os.Exit(code)
}

const e2eNS = "e2e"

// startCluster returns the shared 2-node cluster with the test images
// (testImages) in its registry.
func startCluster(t *testing.T) *Cluster {
	t.Helper()
	requireClusterHost(t)
	if e2eDown {
		t.Fatal("the cluster was already stopped by TestE2EZDown")
	}
	e2eOnce.Do(func() {
		opts := Options{Nodes: 2, RealNodes: 1, StateDir: filepath.Join(os.TempDir(), "sockscale-cluster-e2e")}
		// Long: another package's cluster may hold the machine (see lockHost).
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		start := time.Now()
		e2eCluster, e2eErr = Up(ctx, opts)
		if e2eErr != nil {
			return
		}
		t.Logf("cluster up in %s", time.Since(start).Round(100*time.Millisecond))
		start = time.Now()
		if e2eErr = pushTestImages(ctx, testImages); e2eErr != nil {
			return
		}
		t.Logf("images built and pushed in %s", time.Since(start).Round(100*time.Millisecond))
		_, e2eErr = e2eCluster.Client.CoreV1().Namespaces().Create(ctx,
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e2eNS}}, metav1.CreateOptions{})
		if e2eErr == nil {
			// The namespace's default ServiceAccount comes from the
			// controller-manager; pods are refused until it exists.
			e2eErr = poll(ctx, time.Minute, func() error {
				_, err := e2eCluster.Client.CoreV1().ServiceAccounts(e2eNS).Get(ctx, "default", metav1.GetOptions{})
				return err
			})
		}
	})
	if e2eErr != nil {
		t.Fatalf("cluster up: %v", e2eErr)
	}
	return e2eCluster
}

// requireClusterHost skips t (fails it if CI=true) unless it runs as root
// on a machine with the cluster's binaries.
func requireClusterHost(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t)
	for _, b := range kubeBinaries {
		if _, err := os.Stat(filepath.Join(DefaultKubeBinDir(), b)); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s missing (run make cluster-binaries); CI=true forbids skipping", b)
			}
			t.Skipf("%s missing: run make cluster-binaries (or make test-e2e)", b)
		}
	}
}

// The test images, in the cluster's registry: testdata/echo (as root,
// the user the tests' pods assume) and the agent.
var (
	echoImage  = RegistryAddr + "/e2e/echo:dev"
	agentImage = RegistryAddr + "/e2e/sockscale-agent:dev"
)

var testImages = []imagebuild.Spec{
	{Name: "echo", Package: "./testdata/echo", User: 0},
	{Name: "sockscale-agent", Package: "github.com/sockscale/sockscale/agent/cmd/sockscale-agent", User: 0},
}

// pushTestImages builds images (of testImages) and pushes them to
// RegistryAddr/e2e.
func pushTestImages(ctx context.Context, images []imagebuild.Spec) error {
	epoch, err := imagebuild.SourceDateEpoch(ctx, ".")
	if err != nil {
		return err
	}
	built, err := imagebuild.Build(ctx, imagebuild.Options{Dir: ".", Epoch: epoch}, images)
	if err != nil {
		return err
	}
	_, err = imagebuild.Push(ctx, built, RegistryAddr+"/e2e", "dev")
	return err
}

// deleteAndWaitGone deletes a pod gracefully and waits until the node
// simulator has stopped it and the object is gone.
func deleteAndWaitGone(t *testing.T, c *Cluster, name string) {
	t.Helper()
	ctx := context.Background()
	if err := c.Client.CoreV1().Pods(e2eNS).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "pod gone", func() error {
		_, err := c.Client.CoreV1().Pods(e2eNS).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there: %w", err)
	})
}

func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	if err := poll(context.Background(), timeout, f); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func get(url string) (string, error) {
	// A new connection each time, so a Service spreads them over its pods.
	c := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return string(b), err
}

// echoPod is a pod of testdata/echo with the downward-API env it reports.
func echoPod(name string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e2eNS, Labels: labels},
		Spec:       echoSpec(),
	}
}

func echoSpec() corev1.PodSpec {
	field := func(p string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: p}}
	}
	return corev1.PodSpec{
		TerminationGracePeriodSeconds: ptr.To[int64](10),
		Containers: []corev1.Container{{
			Name: "echo", Image: echoImage,
			Command: []string{"/echo"}, Args: []string{"--listen", ":8080"},
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
			Env: []corev1.EnvVar{
				{Name: "POD_NAME", ValueFrom: field("metadata.name")},
				{Name: "NODE_NAME", ValueFrom: field("spec.nodeName")},
				{Name: "POD_IP", ValueFrom: field("status.podIP")},
			},
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}},
				PeriodSeconds: 1,
			},
		}},
	}
}

// createReadyPod creates p and waits until it is Ready.
func createReadyPod(t *testing.T, c *Cluster, p *corev1.Pod) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	if _, err := c.Client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.Pod
	eventually(t, 60*time.Second, "pod "+p.Name+" ready", func() error {
		var err error
		if got, err = c.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{}); err != nil {
			return err
		}
		if !podReady(got) {
			return fmt.Errorf("not ready: phase %s, statuses %+v", got.Status.Phase, got.Status.ContainerStatuses)
		}
		return nil
	})
	return got
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func TestE2EClusterUp(t *testing.T) {
	c := startCluster(t)
	out, err := exec.Command(filepath.Join(c.opts.KubeBinDir, "kubectl"), "--kubeconfig", c.Kubeconfig, "get", "nodes", "-o", "wide").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl get nodes: %v: %s", err, out)
	}
	t.Logf("kubectl get nodes:\n%s", out)
	for _, n := range []string{"node-a", "node-b", RealNodeName(0)} {
		if !strings.Contains(string(out), n) {
			t.Errorf("kubectl get nodes does not list %s", n)
		}
	}
	var sb strings.Builder
	if err := c.Status(context.Background(), &sb); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sb.String(), "gone") {
		t.Errorf("a process is gone:\n%s", sb.String())
	}
}

func TestE2EDeploymentService(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	labels := map[string]string{"app": "echo"}
	spec := echoSpec()
	// One replica per node, as a real scheduler would spread them when told.
	spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: labels}, TopologyKey: "kubernetes.io/hostname"}}}}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: e2eNS},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](2),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
		},
	}
	if _, err := c.Client.AppsV1().Deployments(e2eNS).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: e2eNS},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}}},
	}
	svc, err := c.Client.CoreV1().Services(e2eNS).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var pods []corev1.Pod
	eventually(t, 90*time.Second, "2 ready pods on 2 nodes", func() error {
		list, err := c.Client.CoreV1().Pods(e2eNS).List(ctx, metav1.ListOptions{LabelSelector: "app=echo"})
		if err != nil {
			return err
		}
		nodes := map[string]bool{}
		for _, p := range list.Items {
			if podReady(&p) {
				nodes[p.Spec.NodeName] = true
			}
		}
		if len(nodes) != 2 {
			return fmt.Errorf("ready on nodes %v of %d pods", nodes, len(list.Items))
		}
		pods = list.Items
		return nil
	})
	dep, err := c.Client.AppsV1().Deployments(e2eNS).Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "deployment ready replicas", func() error {
		if dep, err = c.Client.AppsV1().Deployments(e2eNS).Get(ctx, "echo", metav1.GetOptions{}); err != nil {
			return err
		}
		if dep.Status.ReadyReplicas != 2 {
			return fmt.Errorf("readyReplicas %d", dep.Status.ReadyReplicas)
		}
		return nil
	})

	// Never send to an address that has no local route.
	ip := svc.Spec.ClusterIP
	if err := localroute.Check(netip.MustParseAddr(ip), localroute.DevPrefix(Prefix)); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	eventually(t, 30*time.Second, "both pods answer the ClusterIP from the host", func() error {
		body, err := get("http://" + ip + "/")
		if err != nil {
			return err
		}
		seen[strings.Fields(body)[0]] = true
		if len(seen) < 2 {
			return fmt.Errorf("answers from %v", seen)
		}
		return nil
	})
	// From a pod: the ClusterIP, the Service by DNS name (search path),
	// and the apiserver through the kubernetes Service with its token.
	from := "http://" + pods[0].Status.PodIP + ":8080"
	eventually(t, 30*time.Second, "ClusterIP from a pod", func() error {
		_, err := get(from + "/get?url=http://" + ip + "/")
		return err
	})
	// Some of these land on the asking pod itself (hairpin through its bridge).
	for i := range 8 {
		if _, err := get(from + "/get?url=http://" + ip + "/"); err != nil {
			t.Errorf("ClusterIP from a pod, request %d: %v", i, err)
		}
	}
	eventually(t, 30*time.Second, "Service by name from a pod", func() error {
		body, err := get(from + "/get?url=http://echo/")
		if err == nil && !strings.HasPrefix(body, "pod=echo-") {
			err = fmt.Errorf("answer %q", body)
		}
		return err
	})
	body, err := get(from + "/resolve?name=echo." + e2eNS + ".svc.cluster.local")
	if err != nil || strings.TrimSpace(body) != ip {
		t.Errorf("resolve echo.%s.svc.cluster.local in a pod: %q, %v; want %s", e2eNS, body, err, ip)
	}
	body, err = get(from + "/whoami")
	if want := "system:serviceaccount:" + e2eNS + ":default"; err != nil || !strings.Contains(body, want) {
		t.Errorf("whoami from a pod: %q, %v; want %s", body, err, want)
	}
	// Pod to pod across nodes.
	other := pods[1].Status.PodIP
	if body, err := get(from + "/get?url=http://" + other + ":8080/"); err != nil || !strings.Contains(body, pods[1].Name) {
		t.Errorf("pod to pod across nodes: %q, %v", body, err)
	}
}

func TestE2EHostPathCgroup(t *testing.T) {
	c := startCluster(t)
	p := echoPod("cgroup", nil)
	p.Spec.Volumes = []corev1.Volume{
		{Name: "cgroup", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: c.cgroupRoot}}},
		{Name: "bpffs", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/sys/fs/bpf"}}},
	}
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{
		{Name: "cgroup", MountPath: "/host/cgroup", ReadOnly: true},
		{Name: "bpffs", MountPath: "/sys/fs/bpf"},
	}
	p = createReadyPod(t, c, p)
	base := "http://" + p.Status.PodIP + ":8080"
	body, err := get(base + "/ls?path=/host/cgroup/pods")
	if err != nil || !strings.Contains(body, string(p.UID)) {
		t.Errorf("the pod's cgroup root does not hold its own cgroup %s: %q, %v", p.UID, body, err)
	}
	// The node's subtree only: no other node's directory, no cluster root.
	if body, err := get(base + "/ls?path=/host/cgroup"); err != nil || strings.Contains(body, ClusterName) || strings.Contains(body, "node-") {
		t.Errorf("hostPath %s is not the node's subtree: %q, %v", c.cgroupRoot, body, err)
	}
	// A pin in the pod's /sys/fs/bpf lands in its node's bpffs directory.
	if err := os.Mkdir(filepath.Join(nodeBPFFS(p.Spec.NodeName), "seen-by-pod"), 0o700); err != nil {
		t.Fatal(err)
	}
	if body, err := get(base + "/ls?path=/sys/fs/bpf"); err != nil || !strings.Contains(body, "seen-by-pod") {
		t.Errorf("the pod's /sys/fs/bpf is not %s: %q, %v", nodeBPFFS(p.Spec.NodeName), body, err)
	}
}

func TestE2ECapabilities(t *testing.T) {
	c := startCluster(t)
	few := echoPod("caps-few", nil)
	few.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{
		Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"NET_BIND_SERVICE"}}}
	enough := echoPod("caps-bpf", nil)
	enough.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{
		Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"BPF"}}}
	byDefault := echoPod("caps-default", nil)
	// Not root: granted capabilities do not survive exec (no ambient set).
	nonRoot := echoPod("caps-nonroot", nil)
	nonRoot.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](65534),
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"BPF"}}}
	few, enough, byDefault = createReadyPod(t, c, few), createReadyPod(t, c, enough), createReadyPod(t, c, byDefault)
	nonRoot = createReadyPod(t, c, nonRoot)
	for _, tt := range []struct {
		pod  *corev1.Pod
		want bool
	}{{few, false}, {byDefault, false}, {enough, true}, {nonRoot, false}} {
		body, err := get("http://" + tt.pod.Status.PodIP + ":8080/bpf")
		if got := err == nil; got != tt.want {
			t.Errorf("%s: bpf map create allowed=%v (%q, %v), want %v", tt.pod.Name, got, body, err, tt.want)
		}
	}
}

func TestE2EGracefulDelete(t *testing.T) {
	c := startCluster(t)
	p := createReadyPod(t, c, echoPod("graceful", nil))
	deleteAndWaitGone(t, c, p.Name)
	logPath := PodLogPath(c.StateDir(), e2eNS, p.Name, string(p.UID), "echo")
	b, err := os.ReadFile(logPath)
	if err != nil || !strings.Contains(string(b), "received SIGTERM") {
		t.Errorf("container log %s does not say it got SIGTERM: %q, %v", logPath, b, err)
	}
}

func TestE2EUnknownImage(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	p := echoPod("unknown-image", nil)
	p.Spec.Containers[0].Image = "docker.io/library/nginx:1.27"
	if _, err := c.Client.CoreV1().Pods(e2eNS).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 90*time.Second, "ErrImagePull", func() error {
		got, err := c.Client.CoreV1().Pods(e2eNS).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cs := range got.Status.ContainerStatuses {
			// No route to docker.io here: the pull fails, then backs off.
			if w := cs.State.Waiting; w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") && strings.Contains(w.Message, "nginx") {
				return nil
			}
		}
		return fmt.Errorf("statuses %+v", got.Status.ContainerStatuses)
	})
}

func TestE2ERestarts(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	// Exits at once (a flag it does not know): restarted with backoff.
	crash := echoPod("crash", nil)
	crash.Spec.Containers[0].Args = []string{"--no-such-flag"}
	crash.Spec.Containers[0].ReadinessProbe = nil
	// Runs, but its exec liveness probe fails: killed and restarted.
	unlive := echoPod("unlive", nil)
	unlive.Spec.TerminationGracePeriodSeconds = ptr.To[int64](1)
	unlive.Spec.Containers[0].LivenessProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/false"}}},
		PeriodSeconds: 1, FailureThreshold: 2,
	}
	for _, p := range []*corev1.Pod{crash, unlive} {
		if _, err := c.Client.CoreV1().Pods(e2eNS).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"crash", "unlive"} {
		eventually(t, 60*time.Second, name+" restarted twice", func() error {
			p, err := c.Client.CoreV1().Pods(e2eNS).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 2 {
				if p.Status.Phase != corev1.PodRunning {
					return fmt.Errorf("phase %s, want Running", p.Status.Phase)
				}
				return nil
			}
			return fmt.Errorf("statuses %+v", p.Status.ContainerStatuses)
		})
	}
}

func TestE2EHeadlessDNS(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	labels := map[string]string{"app": "headless"}
	a := createReadyPod(t, c, echoPod("headless-a", labels))
	b := createReadyPod(t, c, echoPod("headless-b", labels))
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "headless", Namespace: e2eNS},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: labels,
			Ports: []corev1.ServicePort{{Port: 8080}}},
	}
	if _, err := c.Client.CoreV1().Services(e2eNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// As the agent resolves the controller's stats Service: <svc>.<ns>.svc.
	eventually(t, 30*time.Second, "headless Service resolves to both pods", func() error {
		body, err := get("http://" + a.Status.PodIP + ":8080/resolve?name=headless." + e2eNS + ".svc")
		if err != nil {
			return err
		}
		if !strings.Contains(body, a.Status.PodIP) || !strings.Contains(body, b.Status.PodIP) {
			return fmt.Errorf("resolved %q, want %s and %s", body, a.Status.PodIP, b.Status.PodIP)
		}
		return nil
	})
}

func TestE2EHostNetwork(t *testing.T) {
	c := startCluster(t)
	p := echoPod("hostnet", nil)
	p.Spec.HostNetwork = true
	p.Spec.Containers[0].Args = []string{"--listen", ":18080"}
	p.Spec.Containers[0].Ports[0].ContainerPort = 18080
	p = createReadyPod(t, c, p)
	if p.Status.PodIP != p.Status.HostIP || p.Status.PodIP != NodeIP(NodeIndex(p.Spec.NodeName)).String() {
		t.Errorf("hostNetwork pod: podIP %s, hostIP %s, want the node's address", p.Status.PodIP, p.Status.HostIP)
	}
	// The host's netns: reachable on loopback too.
	if _, err := get("http://127.0.0.1:18080/"); err != nil {
		t.Error(err)
	}
	// Its own cgroup still.
	cgroup := filepath.Join(nodeCgroup(c.cgroupRoot, p.Spec.NodeName), "pods", string(p.UID))
	if pids := cgroupPIDs(cgroup); len(pids) == 0 {
		t.Errorf("no process in %s", cgroup)
	}
}

func TestE2EConfigAndSecrets(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "conf", Namespace: e2eNS}, Data: map[string]string{"a.yaml": "x: 1", "level": "debug"}}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sec", Namespace: e2eNS}, Data: map[string][]byte{"password": []byte("hunter2")}}
	if _, err := c.Client.CoreV1().ConfigMaps(e2eNS).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.CoreV1().Secrets(e2eNS).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := echoPod("config", nil)
	ctr := &p.Spec.Containers[0]
	ctr.Env = append(ctr.Env,
		corev1.EnvVar{Name: "LEVEL", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "conf"}, Key: "level"}}},
		corev1.EnvVar{Name: "PASSWORD", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: "sec"}, Key: "password"}}},
		corev1.EnvVar{Name: "WHERE", Value: "$(NODE_NAME)/$(POD_NAME)"},
	)
	p.Spec.Volumes = []corev1.Volume{
		{Name: "conf", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "conf"}}}},
		{Name: "sec", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "sec"}}},
		{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	ctr.VolumeMounts = []corev1.VolumeMount{
		{Name: "conf", MountPath: "/etc/e2e-config", ReadOnly: true},
		{Name: "sec", MountPath: "/etc/e2e-secret", ReadOnly: true},
		{Name: "scratch", MountPath: "/e2e-scratch"},
	}
	ctr.SecurityContext = &corev1.SecurityContext{ReadOnlyRootFilesystem: ptr.To(true)}
	p = createReadyPod(t, c, p)
	base := "http://" + p.Status.PodIP + ":8080"
	if _, err := get(base + "/write?path=/tmp/e2e-readonly-root"); err == nil {
		os.Remove("/tmp/e2e-readonly-root")
		t.Error("readOnlyRootFilesystem: the container wrote /tmp")
	}
	for url, want := range map[string]string{
		"/write?path=/e2e-scratch/f":          "ok",
		"/file?path=/etc/e2e-config/a.yaml":   "x: 1",
		"/file?path=/etc/e2e-secret/password": "hunter2",
		"/env?name=LEVEL":                     "debug",
		"/env?name=PASSWORD":                  "hunter2",
		"/env?name=WHERE":                     p.Spec.NodeName + "/config",
		"/env?name=KUBERNETES_SERVICE_HOST":   KubernetesServiceIP.String(),
		"/file?path=/var/run/secrets/kubernetes.io/serviceaccount/namespace": e2eNS,
	} {
		if got, err := get(base + url); err != nil || got != want {
			t.Errorf("GET %s = %q, %v; want %q", url, got, err, want)
		}
	}
}

func TestE2EKubectlLogs(t *testing.T) {
	c := startCluster(t)
	createReadyPod(t, c, echoPod("logs", nil))
	out, err := exec.Command(filepath.Join(c.opts.KubeBinDir, "kubectl"), "--kubeconfig", c.Kubeconfig,
		"-n", e2eNS, "logs", "logs", "--tail=5").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "listening on :8080") {
		t.Errorf("kubectl logs: %q, %v", out, err)
	}
}

func TestE2EStartupProbeAndSIGKILL(t *testing.T) {
	c := startCluster(t)
	p := echoPod("stubborn", nil)
	p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](2)
	ctr := &p.Spec.Containers[0]
	ctr.Args = append(ctr.Args, "--ignore-sigterm")
	ctr.StartupProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}},
		PeriodSeconds: 1, FailureThreshold: 10,
	}
	p = createReadyPod(t, c, p)
	if cs := p.Status.ContainerStatuses[0]; cs.Started == nil || !*cs.Started {
		t.Errorf("ready but not started: %+v", cs)
	}
	start := time.Now()
	deleteAndWaitGone(t, c, p.Name)
	// It ignored SIGTERM: the grace period passed, then SIGKILL.
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("gone after %s, before its 2 s grace period", d)
	}
	if cgroup := filepath.Join(nodeCgroup(c.cgroupRoot, p.Spec.NodeName), "pods", string(p.UID)); dirExists(cgroup) {
		t.Errorf("%s left", cgroup)
	}
}

func dirExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}
