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

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/sockscale/sockscale/agent/stats"
	"github.com/sockscale/sockscale/controller/api/v1alpha1"
	"github.com/sockscale/sockscale/internal/testenv"
)

// TestIntegrationControllerScalesFromAgentStats runs the controller binary
// against a real kube-apiserver, POSTs agent stats to it as an agent would,
// and waits for the Deployment to be scaled.
func TestIntegrationControllerScalesFromAgentStats(t *testing.T) {
	testenv.RequireControlPlane(t)
	env := &envtest.Environment{CRDDirectoryPaths: []string{filepath.Join("..", "..", "charts", "sockscale", "crds")}, ErrorIfCRDPathMissing: true}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start etcd and kube-apiserver: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	user, err := env.AddUser(envtest.User{Name: "sockscale-controller", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, _ := user.KubeConfig()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "hello"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "hello"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "hello", Image: "hello"}}},
			},
		},
	}
	if err := c.Create(ctx, deploy); err != nil {
		t.Fatal(err)
	}
	deploy.Status.Replicas, deploy.Status.ReadyReplicas = 1, 1
	if err := c.Status().Update(ctx, deploy); err != nil {
		t.Fatal(err)
	}
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

	bin := filepath.Join(t.TempDir(), "sockscale-controller")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/sockscale/sockscale/controller/cmd/sockscale-controller").CombinedOutput(); err != nil {
		t.Fatalf("build controller: %v: %s", err, out)
	}
	statsAddr := freeAddr(t)
	cmd := exec.Command(bin, "--stats-bind-address="+statsAddr, "--metrics-bind-address="+freeAddr(t), "--health-probe-bind-address="+freeAddr(t))
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("controller log:\n%s", logs.String())
		}
	})

	// An agent's report: the Deployment's pod has 210 requests in flight,
	// 3 pods' worth at the default target of 70.
	// One report per second, as an agent sends them.
	deadline := time.Now().Add(30 * time.Second)
	var sent time.Time
	for {
		if period := time.Now().Truncate(time.Second).Add(-time.Second); period.After(sent) {
			body, _ := stats.Append(nil, &stats.Batch{Node: "node-a", Start: period, Period: time.Second,
				Pods: []stats.PodStat{{IP: netip.MustParseAddr("10.0.0.5"), Namespace: "default", Pod: "hello-abc", Workload: "hello", Concurrency: 210, Requests: 2100}}})
			if resp, err := http.Post("http://"+statsAddr+stats.Path, stats.ContentType, bytes.NewReader(body)); err == nil {
				resp.Body.Close()
				sent = period
			}
		}
		var d appsv1.Deployment
		if err := c.Get(ctx, client.ObjectKeyFromObject(deploy), &d); err != nil {
			t.Fatal(err)
		}
		if *d.Spec.Replicas == 3 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Deployment has %d replicas, want 3 after the agent's reports", *d.Spec.Replicas)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
