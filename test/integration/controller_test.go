package integration

import (
	"bytes"
	"context"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationControllerScalesFromAgentStats runs the controller binary
// against a real kube-apiserver, POSTs agent stats to it as an agent would,
// and waits for the Deployment to be scaled.
func TestIntegrationControllerScalesFromAgentStats(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c, ctx := cl.Client, context.Background()
	cl.CreateDeployment(t, "default", "hello", 1, 1)
	pa := &v1alpha1.PodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: v1alpha1.PodAutoscalerSpec{
			ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "hello"},
			Service:        v1alpha1.ServiceRef{Name: "hello"},
		},
	}
	if err := c.Create(ctx, pa); err != nil {
		t.Fatal(err)
	}

	statsAddr := startController(t, cl)
	postUntilScaled(t, cl, statsAddr, func(n int32) bool { return n == 3 })
}

// postUntilScaled sends an agent's report every second, as an agent
// would: default/hello's pod has 200 requests in flight, 2.9 pods' worth
// at the default target of 70 (so 3 pods, and not at a boundary where a
// rounding would make it 4); it returns once the Deployment's replicas
// are as wanted and fails the test after 30 s.
func postUntilScaled(t *testing.T, cl *testenv.Cluster, statsAddr string, wanted func(replicas int32) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var sent time.Time
	for {
		if period := time.Now().Truncate(time.Second).Add(-time.Second); period.After(sent) {
			body, _ := stats.Append(nil, &stats.Batch{Node: "node-a", Start: period, Period: time.Second,
				Pods: []stats.PodStat{{IP: netip.MustParseAddr("10.0.0.5"), Namespace: "default", Pod: "hello-abc", Workload: "hello", Concurrency: 200, Requests: 2000}}})
			if resp, err := http.Post("http://"+statsAddr+stats.Path, stats.ContentType, bytes.NewReader(body)); err == nil {
				resp.Body.Close()
				sent = period
			}
		}
		got := cl.Replicas(t, "default", "hello")
		if wanted(got) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Deployment has %d replicas, not as wanted after the agent's reports (2.9 pods' worth)", got)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// startController builds and starts the controller binary against cl and
// returns its stats address; its log is printed if the test fails.
func startController(t *testing.T, cl *testenv.Cluster) string {
	t.Helper()
	addr, _ := startControllerAs(t, cl.Kubeconfig)
	return addr
}

// startControllerAs starts the controller binary with kubeconfig and
// extra flags, and returns its stats address and its log file.
func startControllerAs(t *testing.T, kubeconfig string, flags ...string) (string, string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sockscale-controller")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/sockscale/sockscale/controller/cmd/sockscale-controller").CombinedOutput(); err != nil {
		t.Fatalf("build controller: %v: %s", err, out)
	}
	statsAddr := freeAddr(t)
	// These tests post as agents of nodes and pods that do not exist (no
	// pod-bound tokens to send): authentication has tests of its own
	// (controller/internal/statsauth).
	cmd := exec.Command(bin, append([]string{"--stats-insecure-skip-auth", "--stats-bind-address=" + statsAddr, "--metrics-bind-address=" + freeAddr(t), "--health-probe-bind-address=" + freeAddr(t)}, flags...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	return statsAddr, startLogged(t, "controller", cmd)
}
