package e2e

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
	"github.com/sockscale/sockscale/test/cluster"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// One cluster with the chart installed serves every test of the package;
// TestMain takes it down.
var (
	once   sync.Once
	shared *cluster.Cluster
	st     *stack.Stack
	upErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		if err := shared.Down(); err != nil {
			fmt.Fprintln(os.Stderr, "cluster down:", err)
			code = 1
		}
	}
	os.Exit(code)
}

const appNS = "e2e"

// chartSets are the helm --set values of the package's install: a 20 s
// stable window keeps the scenarios short; Revisions may choose their
// nodes and tolerate taints (as a platform team with a node pool for them
// would allow), so the real node's scenarios can put serving Revisions
// there; targets may start at zero (initial scale 0, a cold start on the
// first request); the metrics APIs and KEDA's scaler are served, over a
// 10 s window (metricsWindow); the rest is the chart's defaults (the
// activator on). A scenario that installs with more sets reinstalls with
// these alone when it ends.
var chartSets = []string{"autoscaler.stable-window=20s", "autoscaler.podspec-nodeselector=enabled", "autoscaler.podspec-tolerations=enabled", "autoscaler.allow-zero-initial-scale=true",
	"controller.metricsAPI.custom=true", "controller.metricsAPI.external=true", "controller.metricsAPI.window=10s", "controller.kedaScaler.enabled=true"}

// up returns the shared cluster with sockscale installed by helm.
func up(t *testing.T) *stack.Stack {
	t.Helper()
	testenv.RequireRoot(t)
	e2etest.RequireHelm(t)
	once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		start := time.Now()
		shared, upErr = cluster.Up(ctx, cluster.Options{Nodes: 2, RealNodes: 1, DualStack: true, StateDir: filepath.Join(os.TempDir(), "sockscale-e2e")})
		if upErr != nil {
			return
		}
		t.Logf("cluster up in %s", time.Since(start).Round(100*time.Millisecond))
		if st, upErr = stack.New(shared.Config, shared.Kubeconfig, stack.HelmFromEnv(), cluster.ServiceCIDR); upErr != nil {
			return
		}
		st.ServiceCIDR6 = cluster.ServiceCIDR6 // the cluster is dual-stack
		// As users would: the images and the packaged chart in a registry
		// (the cluster's), the chart installed from there.
		start = time.Now()
		if upErr = stack.PushImages(ctx); upErr != nil {
			return
		}
		if upErr = st.PushChart(ctx); upErr != nil {
			return
		}
		t.Logf("images and chart pushed to %s in %s", cluster.RegistryAddr, time.Since(start).Round(100*time.Millisecond))
		start = time.Now()
		upErr = st.Install(ctx, chartSets...)
		t.Logf("chart installed in %s", time.Since(start).Round(100*time.Millisecond))
	})
	if upErr != nil {
		t.Fatalf("cluster and chart: %v", upErr)
	}
	return st
}

// deploy makes an app and waits for its first pod and until its public
// Service answers; it returns the public URL.
func deploy(t *testing.T, s *stack.Stack, name string, spec func(*v1alpha1.PodAutoscalerSpec)) string {
	t.Helper()
	return e2etest.Deploy(t, s, appNS, name, spec, func(url string) error {
		if a := get(oneShotClient(5*time.Second), url); a.err != nil || a.code != http.StatusOK {
			return fmt.Errorf("GET %s: %s; %s", url, a, publicPath(context.Background(), s, name))
		}
		return nil
	})
}

// publicPath says where the public Service leads, for a failure's message:
// the ServerlessService's mode and Ready condition and the public
// endpoints.
func publicPath(ctx context.Context, s *stack.Stack, name string) string {
	var sks v1alpha1.ServerlessService
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: name}, &sks); err != nil {
		return "ServerlessService: " + err.Error()
	}
	ready := meta.FindStatusCondition(sks.Status.Conditions, "Ready")
	addrs, ports, err := publicEndpoints(ctx, s, name)
	return fmt.Sprintf("ServerlessService mode %q Ready %+v; public endpoints %v ports %v (%v)", sks.Status.Mode, ready, addrs, ports, err)
}

// TestE2EAgentCountsMatchTheLoad: the agents' per-pod counters equal what
// the load generator did.
func TestE2EAgentCountsMatchTheLoad(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	url := deploy(t, s, "count", func(p *v1alpha1.PodAutoscalerSpec) { p.MinScale, p.MaxScale = ptr.To(int32(1)), ptr.To(int32(1)) })
	series := func() *stack.PodSeries {
		m, err := s.AgentMetrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, ps := range m {
			if ps.Namespace == appNS && ps.Workload == "count" {
				return ps
			}
		}
		t.Fatalf("no agent reports a pod of count: %v", m)
		return nil
	}
	// The agent publishes what it read at its last report (every 1 s):
	// wait until the count stands still, so the requests of deploy's
	// readiness check are in it.
	var before float64
	e2etest.Eventually(t, 10*time.Second, "the agent's count settles", func() error {
		first := series().Values["sockscale_agent_requests_total"]
		time.Sleep(1500 * time.Millisecond)
		if before = series().Values["sockscale_agent_requests_total"]; before != first {
			return fmt.Errorf("still moving: %v then %v", first, before)
		}
		return nil
	})
	res := loadgen.Run(loadgen.Options{URLs: []string{url + "?sleep=20"}, Concurrency: 4, KeepAlive: true}, 3*time.Second)
	if res.Failed > 0 {
		t.Fatalf("%d of %d requests failed", res.Failed, res.Completed+res.Failed)
	}
	// The agent reads the kernel's counters every report period (1 s).
	e2etest.Eventually(t, 10*time.Second, "the agent's count", func() error {
		ps := series()
		got := ps.Values["sockscale_agent_requests_total"] - before
		if got != float64(res.Completed) {
			return fmt.Errorf("pod %s: %v requests counted, the client completed %d", ps.Pod, got, res.Completed)
		}
		if inFlight := ps.Values["sockscale_agent_requests_in_flight"]; inFlight != 0 {
			return fmt.Errorf("%v requests in flight after the load", inFlight)
		}
		return nil
	})
}

// TestE2EStepLoad: the pod count follows 1 -> 2 -> 3 -> 4 as the offered
// concurrency steps up, inside the step-load band (docs/autoscaling.md,
// "The step-load band") at every check, every request
// succeeds, the public endpoints are the pods, and the count comes back
// down after the load.
func TestE2EStepLoad(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	// target 10 x 70 % = 7 requests in flight per pod; TBC 0 keeps the
	// pods themselves behind the public Service (Serve).
	url := deploy(t, s, "step", func(p *v1alpha1.PodAutoscalerSpec) {
		p.Target, p.MinScale, p.MaxScale = ptr.To(10.0), ptr.To(int32(1)), ptr.To(int32(10))
		p.TargetBurstCapacity = ptr.To(0.0)
	})
	var loads []*loadgen.Load
	defer func() {
		for _, l := range loads {
			l.Stop()
		}
	}()
	offered := 0
	for _, step := range []int{7, 14, 21, 28} {
		// Each added client holds a request of 200 ms at a time.
		loads = append(loads, loadgen.Start(ctx, loadgen.Options{URLs: []string{url + "?sleep=200"}, Concurrency: step - offered, KeepAlive: true}))
		offered = step
		want := float64(offered) / 7
		lo, hi := int32(math.Floor(want))-1, int32(math.Ceil(math.Ceil(want)*1.1))
		e2etest.Eventually(t, 90*time.Second, fmt.Sprintf("%d pods ready at %d in flight", int(want), offered), func() error {
			if got := ready(t, s, "step"); got < int32(want) {
				return fmt.Errorf("%d ready", got)
			}
			return nil
		})
		for range 10 {
			if got := replicas(t, s, "step"); got < lo || got > hi {
				t.Fatalf("at %d in flight the target wants %d pods, outside the step-load band [%d, %d]", offered, got, lo, hi)
			}
			time.Sleep(time.Second)
		}
		t.Logf("%d in flight: %d pods; PodAutoscaler %s", offered, replicas(t, s, "step"), paLine(t, s, "step"))
	}
	expectServeEndpoints(t, s, "step")
	var completed, failed int64
	for _, l := range loads {
		r := l.Stop()
		completed, failed = completed+r.Completed, failed+r.Failed
	}
	loads = nil
	if total := completed + failed; total == 0 || float64(completed)/float64(total) < 0.999 {
		t.Errorf("%d of %d requests succeeded, want >= 99.9 %%", completed, total)
	}
	t.Logf("%d requests, %d failed", completed, failed)
	// Idle: down to minScale 1 (a 20 s window, rate-limited halving).
	e2etest.Eventually(t, 3*time.Minute, "back to 1 pod after the load", func() error {
		if got := replicas(t, s, "step"); got != 1 {
			return fmt.Errorf("%d pods", got)
		}
		return nil
	})
}

// TestE2EPanic: a burst puts the target in panic, visible in its status.
func TestE2EPanic(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	url := deploy(t, s, "burst", func(p *v1alpha1.PodAutoscalerSpec) {
		p.Target, p.MinScale, p.MaxScale = ptr.To(10.0), ptr.To(int32(1)), ptr.To(int32(8))
		p.TargetBurstCapacity = ptr.To(0.0)
	})
	// 35 in flight on one pod: the panic window alone wants 5 pods, 5/1 >= 200 %.
	l := loadgen.Start(ctx, loadgen.Options{URLs: []string{url + "?sleep=200"}, Concurrency: 35, KeepAlive: true})
	defer l.Stop()
	e2etest.Eventually(t, 30*time.Second, "panic in the PodAutoscaler's status", func() error {
		pa, err := s.PA(ctx, appNS, "burst")
		if err != nil {
			return err
		}
		if !pa.Status.Panicking {
			return fmt.Errorf("not panicking: %s", paLine(t, s, "burst"))
		}
		return nil
	})
	t.Logf("panicking: %s", paLine(t, s, "burst"))
	// The panic window fills within its 2 s (10 % of 20 s): 5 pods' worth.
	e2etest.Eventually(t, 20*time.Second, "at least 4 pods wanted in panic", func() error {
		if got := replicas(t, s, "burst"); got < 4 {
			return fmt.Errorf("%d pods wanted: %s", got, paLine(t, s, "burst"))
		}
		return nil
	})
	t.Logf("scaled up in panic: %s", paLine(t, s, "burst"))
	// The leader logs the transition with its numbers.
	e2etest.Eventually(t, 10*time.Second, "PANICKING in the controller's log", func() error {
		out, err := exec.Command(filepath.Join(cluster.DefaultKubeBinDir(), "kubectl"), "--kubeconfig", shared.Kubeconfig,
			"logs", "-n", stack.Namespace, "-l", "app.kubernetes.io/component=controller", "--tail=-1").CombinedOutput()
		if err != nil {
			return fmt.Errorf("kubectl logs: %w: %s", err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, "PANICKING") && strings.Contains(line, "e2e/burst") {
				t.Logf("controller: %s", line)
				return nil
			}
		}
		return fmt.Errorf("no PANICKING line for e2e/burst in %d bytes of logs", len(out))
	})
	if r := l.Stop(); r.Failed > 0 {
		t.Errorf("%d of %d requests failed during the burst", r.Failed, r.Completed+r.Failed)
	}
}

// TestE2EBadPodAutoscalerRejected: the API server refuses a bad spec with a
// message naming the rule.
func TestE2EBadPodAutoscalerRejected(t *testing.T) {
	s := up(t)
	pa := &v1alpha1.PodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: "bad"},
		Spec: v1alpha1.PodAutoscalerSpec{
			ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "bad"},
			Service:        v1alpha1.ServiceRef{Name: "bad"},
			MinScale:       ptr.To(int32(5)), MaxScale: ptr.To(int32(2)),
		},
	}
	err := s.Client.Create(context.Background(), pa)
	if err == nil || !strings.Contains(err.Error(), "minScale must not exceed maxScale") {
		t.Fatalf("create a PodAutoscaler with minScale 5 > maxScale 2: %v, want it refused naming the rule", err)
	}
}

func replicas(t *testing.T, s *stack.Stack, name string) int32 {
	t.Helper()
	d, err := s.Deployment(context.Background(), appNS, name)
	if err != nil {
		t.Fatal(err)
	}
	return *d.Spec.Replicas
}

func ready(t *testing.T, s *stack.Stack, name string) int32 {
	t.Helper()
	d, err := s.Deployment(context.Background(), appNS, name)
	if err != nil {
		t.Fatal(err)
	}
	return d.Status.ReadyReplicas
}

// paLine is what `kubectl get pa` shows.
func paLine(t *testing.T, s *stack.Stack, name string) string {
	t.Helper()
	st := paOf(t, s, name).Status
	line := fmt.Sprintf("desired %v actual %v mode %s stable %s panic %s panicking %v", deref(st.DesiredScale), deref(st.ActualScale), st.Mode, st.StableValue, st.PanicValue, st.Panicking)
	for _, c := range st.Conditions {
		if c.Status != metav1.ConditionTrue {
			line += fmt.Sprintf("; %s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message)
		}
	}
	return line
}

// paOf reads the PodAutoscaler name.
func paOf(t *testing.T, s *stack.Stack, name string) *v1alpha1.PodAutoscaler {
	t.Helper()
	pa, err := s.PA(context.Background(), appNS, name)
	if err != nil {
		t.Fatal(err)
	}
	return pa
}

// expectServeEndpoints: the public Service's endpoints are exactly the
// ready pods (Serve mode).
func expectServeEndpoints(t *testing.T, s *stack.Stack, name string) {
	t.Helper()
	ctx := context.Background()
	e2etest.Eventually(t, 20*time.Second, "public endpoints are the ready pods", func() error {
		var pods corev1.PodList
		if err := s.Client.List(ctx, &pods, client.InNamespace(appNS), client.MatchingLabels{"app": name}); err != nil {
			return err
		}
		var want []string
		for _, p := range pods.Items {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
					want = append(want, p.Status.PodIP)
				}
			}
		}
		var slices discoveryv1.EndpointSliceList
		if err := s.Client.List(ctx, &slices, client.InNamespace(appNS), client.MatchingLabels{discoveryv1.LabelServiceName: name}); err != nil {
			return err
		}
		var got []string
		for _, sl := range slices.Items {
			for _, e := range sl.Endpoints {
				got = append(got, e.Addresses...)
			}
		}
		sort.Slice(want, func(i, j int) bool { return netip.MustParseAddr(want[i]).Less(netip.MustParseAddr(want[j])) })
		sort.Slice(got, func(i, j int) bool { return netip.MustParseAddr(got[i]).Less(netip.MustParseAddr(got[j])) })
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("public endpoints %v, ready pods %v", got, want)
		}
		pa, err := s.PA(ctx, appNS, name)
		if err != nil {
			return err
		}
		if pa.Status.Mode != v1alpha1.ModeServe {
			return fmt.Errorf("mode %q, want Serve", pa.Status.Mode)
		}
		return nil
	})
}

func deref[T any](p *T) any {
	if p == nil {
		return "<none>"
	}
	return *p
}
