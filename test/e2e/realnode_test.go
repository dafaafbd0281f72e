package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/test/cluster"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// The scenarios on the cluster's real node: a real kubelet, containerd,
// runc and the CNI bridge, with the chart's agent there as a real
// container of its own agent pool (agent.pools.<node>: its cgroup root is
// the node's cgroup). The other scenarios' pods stay off it (its taint).

// realNode is the shared cluster's real node.
func realNode(t *testing.T) string {
	t.Helper()
	if shared == nil || shared.RealNodes() < 1 {
		t.Fatal("the shared cluster has no real node")
	}
	return cluster.RealNodeName(0)
}

// onRealNode is the app's pod spec on the real node, with an HTTP
// liveness probe beside its readiness probe: both the kubelet's, every
// second.
func onRealNode(node string) func(*corev1.PodSpec) {
	return func(p *corev1.PodSpec) {
		stack.OnRealNode(node)(p)
		p.Containers[0].LivenessProbe = &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("http")}},
			PeriodSeconds: 1, FailureThreshold: 5,
		}
	}
}

// realPod is the one pod of app name, which must run on node in a
// container of containerd.
func realPod(t *testing.T, s *stack.Stack, name, node string) corev1.Pod {
	t.Helper()
	var pods corev1.PodList
	if err := s.Client.List(context.Background(), &pods, client.InNamespace(appNS), client.MatchingLabels{"app": name}); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		if p.Spec.NodeName != node || len(p.Status.ContainerStatuses) == 0 || !strings.HasPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://") {
			t.Fatalf("pod %s: node %q, containers %+v; want a containerd container on %s", p.Name, p.Spec.NodeName, p.Status.ContainerStatuses, node)
		}
		return p
	}
	t.Fatalf("no pod of %s", name)
	return corev1.Pod{}
}

// TestE2ERealNodeCountsExactly: the real node's agent counts a real
// container's requests exactly as the client made them, while the real
// kubelet probes the pod every second (readiness and liveness, HTTP):
// the probes are counted as probes, not as load.
func TestE2ERealNodeCountsExactly(t *testing.T) {
	s := up(t)
	node := realNode(t)
	ctx := context.Background()
	const name = "real-count"
	url := e2etest.DeployApp(t, s, stack.App{Namespace: appNS, Name: name, Pod: onRealNode(node),
		Spec: func(p *v1alpha1.PodAutoscalerSpec) { p.MinScale, p.MaxScale = ptr.To(int32(1)), ptr.To(int32(1)) }},
		func(url string) error {
			if a := get(oneShotClient(5*time.Second), url); a.err != nil || a.code != http.StatusOK {
				return fmt.Errorf("GET %s: %s", url, a)
			}
			return nil
		})
	removeAtEnd(t, s, name)
	pod := realPod(t, s, name, node)
	series := func() *stack.PodSeries {
		m, err := s.AgentMetrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ps := m[appNS+"/"+pod.Name]; ps != nil {
			return ps
		}
		t.Fatalf("no agent reports pod %s", pod.Name)
		return nil
	}
	// Settled: the deploy's own requests are in the count.
	var before *stack.PodSeries
	e2etest.Eventually(t, 15*time.Second, "the real node agent's count settles", func() error {
		first := series().Values["sockscale_agent_requests_total"]
		time.Sleep(1500 * time.Millisecond)
		if before = series(); before.Values["sockscale_agent_requests_total"] != first {
			return fmt.Errorf("still moving: %v then %v", first, before.Values["sockscale_agent_requests_total"])
		}
		return nil
	})
	res := loadgen.Run(loadgen.Options{URLs: []string{url + "?sleep=20"}, Concurrency: 4, KeepAlive: true}, 5*time.Second)
	if res.Failed > 0 || res.Completed == 0 {
		t.Fatalf("%d of %d requests failed", res.Failed, res.Completed+res.Failed)
	}
	var after *stack.PodSeries
	e2etest.Eventually(t, 10*time.Second, "the real node agent's count", func() error {
		after = series()
		if got := after.Values["sockscale_agent_requests_total"] - before.Values["sockscale_agent_requests_total"]; got != float64(res.Completed) {
			return fmt.Errorf("pod %s: %v requests counted, the client completed %d", pod.Name, got, res.Completed)
		}
		if inFlight := after.Values["sockscale_agent_requests_in_flight"]; inFlight != 0 {
			return fmt.Errorf("%v requests in flight after the load", inFlight)
		}
		return nil
	})
	// Two probes a second for the 5 s of load and more: counted as probes.
	probes := after.Values["sockscale_agent_probes_total"] - before.Values["sockscale_agent_probes_total"]
	t.Logf("pod %s on %s (%s): %d requests by the client, the same counted; %v kubelet probes counted apart", pod.Name, node, pod.Status.ContainerStatuses[0].ContainerID[:25], res.Completed, probes)
	if probes < 8 {
		t.Errorf("%v probes counted during the load, want the kubelet's two a second", probes)
	}
}

// TestE2ERealNodeColdStart: a target on the real node scales to zero and
// back through the activator with a real cold start (containerd makes the
// sandbox, pulls nothing it has, starts the container; the kubelet
// probes it ready): ten requests held at zero are all answered 200, and
// one cold start's steps are printed as this test's watches saw them
// (stack.ColdStartTrace).
func TestE2ERealNodeColdStart(t *testing.T) {
	s := up(t)
	node := realNode(t)
	ctx := context.Background()
	const name = "real-cold"
	url := e2etest.DeployApp(t, s, stack.App{Namespace: appNS, Name: name, Pod: onRealNode(node),
		Spec: func(p *v1alpha1.PodAutoscalerSpec) {
			p.Window = &metav1.Duration{Duration: 10 * time.Second}
			p.MaxScale = ptr.To(int32(2))
		}},
		func(url string) error {
			if a := get(oneShotClient(5*time.Second), url); a.err != nil || a.code != http.StatusOK {
				return fmt.Errorf("GET %s: %s", url, a)
			}
			return nil
		})
	removeAtEnd(t, s, name)
	realPod(t, s, name, node)
	waitAtZero(t, s, 3*time.Minute, name)

	cs, err := kubernetes.NewForConfig(shared.Config)
	if err != nil {
		t.Fatal(err)
	}
	trace, err := stack.WatchColdStart(ctx, cs, appNS, name)
	if err != nil {
		t.Fatal(err)
	}
	defer trace.Stop()
	const held = 10
	hc := &http.Client{Timeout: 2 * time.Minute}
	start := time.Now()
	var wg sync.WaitGroup
	answers := make([]answer, held)
	for i := range answers {
		wg.Go(func() { answers[i] = get(hc, url) })
	}
	wg.Wait()
	for i, a := range answers {
		if a.err != nil || a.code != http.StatusOK || !strings.HasPrefix(a.body, "pod ") {
			t.Errorf("request %d at zero: %s, want 200 from a pod", i, a)
		}
	}
	first := answers[0].end
	for _, a := range answers {
		if a.end.Before(first) {
			first = a.end
		}
	}
	waitReady(t, trace)
	trace.Stop()
	t.Logf("%d requests at zero on %s: %s", held, node, trace.Breakdown(start, first))
	if p := realPod(t, s, name, node); p.Spec.NodeName != node {
		t.Errorf("the new pod runs on %s", p.Spec.NodeName)
	}
}

// waitReady waits until the trace saw the pod Ready.
func waitReady(t *testing.T, tr *stack.ColdStartTrace) {
	t.Helper()
	e2etest.Eventually(t, 30*time.Second, "the new pod Ready", func() error {
		if st := tr.Steps(); st.Ready.IsZero() {
			return fmt.Errorf("pod %q not Ready yet", st.Pod)
		}
		return nil
	})
}
