package main

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// replica is one sockscale-controller process.
type replica struct {
	name           string
	cmd            *exec.Cmd
	stats, metrics string
	logs           *bytes.Buffer
	exited         chan struct{}
}

// TestIntegrationFailover runs two replicas with leader election against
// a real kube-apiserver, an agent reporting to both, and stops the leader
// the way a rollout does (SIGTERM). The standby keeps windows for the
// PodAutoscaler while it is not leading (its collected-targets metric),
// takes the lease within a retry period because the leader releases it,
// and goes on deciding from the windows it kept: no scale-down at the
// handover, and the next change of load is acted on.
func TestIntegrationFailover(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c, ctx := cl.Client, context.Background()
	cl.CreateDeployment(t, "default", "hello", 1, 1)
	if err := c.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, &v1alpha1.PodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: v1alpha1.PodAutoscalerSpec{
			ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "hello"},
			Service:        v1alpha1.ServiceRef{Name: "hello"},
		},
	}); err != nil {
		t.Fatal(err)
	}
	bin := buildController(t)
	start := func(name string) *replica { return startReplica(t, cl, bin, name) }

	// The agent: one pod of hello with load in flight, reported every
	// second to every replica (as an agent resolving the headless Service).
	var mu sync.Mutex
	load := 200.0 // ceil(200/70) = 3 pods at the default target of 70
	var replicas []*replica
	stop := make(chan struct{})
	defer close(stop)
	agent := func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-tick.C:
				mu.Lock()
				b := &stats.Batch{Node: "node-a", Start: now.Add(-time.Second), Period: time.Second, Pods: []stats.PodStat{{
					IP: netip.MustParseAddr("10.0.0.5"), Namespace: "default", Pod: "hello-abc", Workload: "hello", Concurrency: load, Requests: uint64(load * 10)}}}
				to := append([]*replica(nil), replicas...)
				mu.Unlock()
				body, _ := stats.Append(nil, b)
				for _, r := range to {
					if resp, err := http.Post("http://"+r.stats+stats.Path, stats.ContentType, bytes.NewReader(body)); err == nil {
						resp.Body.Close()
					}
				}
			}
		}
	}

	a := start("replica-a")
	waitFor(t, 60*time.Second, "replica-a to lead", func() bool { return a.metric("leader_election_master_status") == 1 })
	b := start("replica-b")
	mu.Lock()
	replicas = []*replica{a, b}
	mu.Unlock()
	go agent()
	waitFor(t, 60*time.Second, "the leader to scale hello to 3", func() bool { return cl.Replicas(t, "default", "hello") == 3 })
	// The standby keeps the windows too, though it decides nothing.
	if got := b.metric("sockscale_controller_collected_targets"); got != 1 {
		t.Errorf("the standby keeps windows for %v PodAutoscalers, want 1", got)
	}
	if got := b.metric("leader_election_master_status"); got != 0 {
		t.Fatalf("replica-b leads too (%v)", got)
	}
	time.Sleep(5 * time.Second) // some history in the standby's windows

	// A rollout stops the leader.
	stopped := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("replica-a did not stop within 30 s of SIGTERM")
	}
	mu.Lock()
	replicas = []*replica{b}
	mu.Unlock()
	waitFor(t, 30*time.Second, "replica-b to lead", func() bool {
		if got := cl.Replicas(t, "default", "hello"); got < 3 {
			t.Fatalf("%s after the leader stopped: hello has %d replicas, want at least 3", time.Since(stopped).Round(time.Millisecond), got)
		}
		return b.metric("leader_election_master_status") == 1
	})
	// The released lease is taken within a retry period (2 s) and some
	// slack on a busy machine, not after the lease duration (15 s).
	took := time.Since(stopped)
	t.Logf("replica-b led %s after replica-a was told to stop", took.Round(time.Millisecond))
	if took > 8*time.Second {
		t.Errorf("replica-b led %s after replica-a was told to stop, want within 8 s (the lease was not released)", took.Round(time.Millisecond))
	}

	// The new leader decides: twice the load, ceil(400/70) = 6 pods.
	mu.Lock()
	load = 400
	mu.Unlock()
	changed := time.Now()
	defer func() {
		t.Logf("replica-b scaled to 6 %s after the load doubled", time.Since(changed).Round(time.Millisecond))
	}()
	waitFor(t, 30*time.Second, "replica-b to scale hello to 6", func() bool {
		got := cl.Replicas(t, "default", "hello")
		if got < 3 {
			t.Fatalf("hello went down to %d replicas under the new leader", got)
		}
		return got == 6
	})
}

// buildController builds the controller's binary for the test.
func buildController(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sockscale-controller")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build controller: %v: %s", err, out)
	}
	return bin
}

// startReplica starts a replica named name (its POD_NAME) with leader
// election, taking stats unauthenticated, and extra flags; it is killed
// when t ends, and its log printed if t failed.
func startReplica(t *testing.T, cl *testenv.Cluster, bin, name string, extra ...string) *replica {
	t.Helper()
	r := &replica{name: name, stats: freeAddr(t), metrics: freeAddr(t), logs: &bytes.Buffer{}, exited: make(chan struct{})}
	// The replicas take stats from a made-up agent (no pod-bound token):
	// authentication has tests of its own (internal/statsauth).
	args := append([]string{"--leader-elect", "--stats-insecure-skip-auth", "--stats-bind-address=" + r.stats, "--metrics-bind-address=" + r.metrics,
		"--metrics-secure=false", "--health-probe-bind-address=" + freeAddr(t)}, extra...)
	r.cmd = exec.Command(bin, args...)
	r.cmd.Env = append(os.Environ(), "KUBECONFIG="+cl.Kubeconfig, "POD_NAMESPACE=default", "POD_NAME="+name)
	r.cmd.Stdout, r.cmd.Stderr = r.logs, r.logs // one writer: exec serializes its writes
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.cmd.Wait(); close(r.exited) }()
	t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		<-r.exited
		if t.Failed() {
			t.Logf("%s log:\n%s", name, r.logs.String())
		}
	})
	return r
}

// metric is the value of the first series of name on the replica's
// /metrics, or -1.
func (r *replica) metric(name string) float64 {
	resp, err := http.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			return v
		}
	}
	return -1
}

func waitFor(t *testing.T, limit time.Duration, what string, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", limit, what)
		}
		time.Sleep(100 * time.Millisecond)
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
