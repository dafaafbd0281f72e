//go:build linux

package integration

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/internal/testutil/statssink"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
	"github.com/sockscale/sockscale/internal/testutil/testpod"
)

func TestMain(m *testing.M) {
	testpod.Main()
	os.Exit(m.Run())
}

// TestIntegrationAgentEndToEnd runs the real agent binary against a real
// kube-apiserver and etcd, a fake pod in its own network namespace and
// cgroup, and real HTTP load; it checks /metrics, the stats the agent
// reports, a restart under load, and --uninstall.
func TestIntegrationAgentEndToEnd(t *testing.T) {
	testenv.RequireRoot(t)
	cl := testenv.ControlPlane(t)
	client, kubeconfig := kubernetes.NewForConfigOrDie(cl.Config), cl.Kubeconfig
	if err := testenv.EnsureBPFFS("/sys/fs/bpf"); err != nil {
		t.Fatal(err)
	}
	cg2, err := cgroup2.Root()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(cg2, fmt.Sprintf("sockscale-it-%d", os.Getpid()))
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(root) })
	pod := testpod.New(t, testpod.Options{Subnet: 91, CgroupParent: root})
	if err := pod.Start(testpod.RoleHTTP, testpod.HTTPPort); err != nil {
		t.Fatal(err)
	}
	createPod(t, client, pod)

	recv := newStatsReceiver(t)
	pinDir := fmt.Sprintf("/sys/fs/bpf/sockscale-it-%d", os.Getpid())
	bin := buildAgent(t)
	metricsAddr, healthAddr := freeAddr(t), freeAddr(t)
	args := []string{
		"--node-name=node-a", "--cgroup-root=" + root, "--bpffs-dir=" + pinDir, "--kubeconfig=" + kubeconfig, "--activator-namespace=default",
		"--metrics-bind-address=" + metricsAddr, "--metrics-secure=false", "--health-probe-bind-address=" + healthAddr,
		"--controller-stats-address=" + recv.addr, "--report-period=1s", "--log-level=debug",
	}
	t.Cleanup(func() { _ = exec.Command(bin, "--uninstall", "--bpffs-dir="+pinDir).Run() })
	agent := startAgent(t, bin, args, healthAddr)

	// Load: 8 clients, 100 ms handler.
	load := loadgen.Start(context.Background(), loadgen.Options{URLs: []string{"http://" + pod.Addr(testpod.HTTPPort) + "/?sleep=100ms"}, Concurrency: 8, KeepAlive: true})
	time.Sleep(3500 * time.Millisecond)

	// The stats the controller would get: steady periods average ~8.
	steady := recv.concurrencies("web-5d8f7c-abcde")
	if len(steady) < 2 {
		t.Fatalf("got %d stats periods for the pod, want at least 2: %v", len(steady), steady)
	}
	mid := steady[len(steady)-1]
	if math.Abs(mid-8)/8 > 0.05 {
		t.Errorf("reported average concurrency %.3f in a steady period, want 8 within 5%% (all periods: %v)", mid, steady)
	}

	// Restart the agent under load: the pinned programs keep counting.
	stopAgent(t, agent)
	time.Sleep(300 * time.Millisecond)
	agent = startAgent(t, bin, args, healthAddr)
	time.Sleep(1500 * time.Millisecond)
	res := load.Stop()
	if res.Failed > 0 {
		t.Errorf("%d requests failed", res.Failed)
	}

	// /metrics: every request the clients completed, with the pod's names.
	labels := map[string]string{"namespace": "default", "pod": "web-5d8f7c-abcde", "workload": "web"}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := scrape(t, metricsAddr, "sockscale_agent_requests_total", labels)
		if got == float64(res.Completed) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sockscale_agent_requests_total = %v, want the clients' %d", got, res.Completed)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if v := scrape(t, metricsAddr, "sockscale_agent_tracked_pods", nil); v != 1 {
		t.Errorf("tracked pods = %v, want 1", v)
	}
	stopAgent(t, agent)

	out, err := exec.Command(bin, "--uninstall", "--bpffs-dir="+pinDir).CombinedOutput()
	if err != nil {
		t.Fatalf("--uninstall: %v: %s", err, out)
	}
	if _, err := os.Stat(pinDir); !os.IsNotExist(err) {
		t.Errorf("pins still there after --uninstall: %v", err)
	}
	if out, _ := exec.Command("bpftool", "cgroup", "show", root).CombinedOutput(); strings.Contains(string(out), "sockscale_") {
		t.Errorf("programs still attached after --uninstall:\n%s", out)
	}
}

// createPod makes the API object of a Deployment's pod on node-a whose
// address is the fake pod's.
func createPod(t *testing.T, client kubernetes.Interface, fp *testpod.Pod) {
	t.Helper()
	yes := true
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default", Name: "web-5d8f7c-abcde",
			Labels:          map[string]string{"app": "web", "pod-template-hash": "5d8f7c"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-5d8f7c", UID: "rs-uid", Controller: &yes}},
		},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "web", Image: "web"}}},
	}
	ctx := context.Background()
	created, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: fp.IP.String(), PodIPs: []corev1.PodIP{{IP: fp.IP.String()}}}
	if _, err := client.CoreV1().Pods("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func buildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sockscale-agent")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/sockscale/sockscale/agent/cmd/sockscale-agent")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build agent: %v: %s", err, out)
	}
	return bin
}

func startAgent(t *testing.T, bin string, args []string, healthAddr string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, args...)
	startLogged(t, "agent", cmd)
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + healthAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return cmd
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("agent never became ready in 20 s (its log follows)")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func stopAgent(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("agent exited with %v after SIGTERM, want a clean exit", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("agent did not stop within 10s of SIGTERM")
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// statsReceiver stands in for a controller replica.
type statsReceiver struct {
	addr    string
	mu      sync.Mutex
	batches []*stats.Batch
}

func newStatsReceiver(t *testing.T) *statsReceiver {
	r := &statsReceiver{}
	srv := httptest.NewServer(statssink.Handler(func(b *stats.Batch) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.batches = append(r.batches, b)
	}))
	t.Cleanup(srv.Close)
	r.addr = srv.Listener.Addr().String()
	return r
}

// concurrencies lists the pod's reported average concurrency per period,
// oldest first, skipping periods where it had no requests yet.
func (r *statsReceiver) concurrencies(pod string) []float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []float64
	for _, b := range r.batches {
		for _, p := range b.Pods {
			if p.Pod == pod && p.Requests > 0 {
				out = append(out, p.Concurrency)
			}
		}
	}
	return out
}

// scrape returns the value of the series of name with these labels.
func scrape(t *testing.T, addr, name string, labels map[string]string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	fam, ok := families[name]
	if !ok {
		return math.NaN()
	}
	for _, m := range fam.GetMetric() {
		if matches(m, labels) {
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	return math.NaN()
}

func matches(m *dto.Metric, labels map[string]string) bool {
	for k, v := range labels {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == k && lp.GetValue() == v {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// startLogged starts cmd, kills it when t ends, and then prints its output
// (name's log) if t failed. It returns the log file's path.
func startLogged(t *testing.T, name string, cmd *exec.Cmd) string {
	t.Helper()
	logFile, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			out, _ := os.ReadFile(logFile.Name())
			t.Logf("%s log:\n%s", name, out)
		}
	})
	return logFile.Name()
}
