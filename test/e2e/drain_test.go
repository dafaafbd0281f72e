package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/test/cluster"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// TestE2EDrainOnTheRealNode: a serving Revision's pods on the real node
// (a real kubelet runs their preStop hook, which waits at the node's
// agent) leave without failing a request, though the app exits the
// moment it gets SIGTERM, as most apps do (the test app's
// --exit-on-sigterm: requests in flight are cut, the listener is gone).
// Under a steady load of keep-alive and new-connection clients, and
// 5-second requests in flight on most pods: the Revision, held at 8 pods
// by a burst, scales 8 -> 2 when the burst ends; and a rollout retires
// all 8 pods of the first Revision. Each on the direct path (TBC 0: the
// Revision's public Service, or the Route's split in the kernel, to the
// pods) and through the activators (TBC -1), the two paths side by side.
// Every request is answered 200, the slow ones too; the node's agent
// drained every leaving pod and cut no request.
func TestE2EDrainOnTheRealNode(t *testing.T) {
	s := up(t)
	node := realNode(t)
	agent := agentAddr(t, s, node)
	drainedBefore := scrapeSum(t, s, agent, "sockscale_agent_drains_total", map[string]string{"result": "drained"})
	cutBefore := scrapeSum(t, s, agent, "sockscale_agent_drain_requests_cut_total", nil)
	var leaving atomic.Int64
	for _, rollout := range []bool{false, true} {
		wave := map[bool]string{false: "scale 8 to 2", true: "rollout"}[rollout]
		t.Run(wave, func(t *testing.T) {
			for _, path := range []struct{ name, tbc string }{{"direct", "0"}, {"through the activators", "-1"}} {
				t.Run(path.name, func(t *testing.T) {
					t.Parallel()
					service := fmt.Sprintf("drain-%s-%s", map[bool]string{false: "scale", true: "roll"}[rollout], map[string]string{"0": "direct", "-1": "proxied"}[path.tbc])
					leaving.Add(int64(drainScenario(t, s, node, service, path.tbc, rollout)))
				})
			}
		})
	}
	drained := scrapeSum(t, s, agent, "sockscale_agent_drains_total", map[string]string{"result": "drained"}) - drainedBefore
	cut := scrapeSum(t, s, agent, "sockscale_agent_drain_requests_cut_total", nil) - cutBefore
	t.Logf("%s's agent: %v pods drained (%d left), %v requests cut", node, drained, leaving.Load(), cut)
	if drained < float64(leaving.Load()) || cut != 0 {
		t.Errorf("the agent drained %v of the %d pods that left and cut %v requests; want all drained, none cut", drained, leaving.Load(), cut)
	}
}

// drainScenario runs one case of TestE2EDrainOnTheRealNode and returns how
// many pods left.
func drainScenario(t *testing.T, s *stack.Stack, node, name, tbc string, rollout bool) int {
	ctx := context.Background()
	svc := servingService(name, "v1", map[string]string{
		"autoscaling.knative.dev/initial-scale":         "8",
		"autoscaling.knative.dev/min-scale":             "2",
		"autoscaling.knative.dev/max-scale":             "8",
		"autoscaling.knative.dev/target":                "8",
		"autoscaling.knative.dev/target-burst-capacity": tbc,
	})
	spec := &svc.Spec.Template.Spec
	spec.Containers[0].Args = []string{"--exit-on-sigterm"}
	spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
	spec.Tolerations = []corev1.Toleration{{Key: cluster.RealNodeTaint, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	createServing(t, s, svc)
	first := name + "-00001"
	waitLatestReady(t, s, name, first, 3*time.Minute)
	scales := watchScales(t, s, appNS, first)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s's desired scale over the case: %v", first, scales())
			logLines(t, s, "agent-pool", "draining", "drained", "pod went", "cannot read", "cannot list")
		}
	})
	// The Revision's own public Service: in Serve (TBC 0) its pods behind
	// kube-proxy, the direct path; a Route's address goes through the
	// activators.
	service := name
	if !rollout {
		var rev servingv1alpha1.Revision
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: first}, &rev); err != nil {
			t.Fatal(err)
		}
		service = rev.Status.ServiceName
	}
	url := "http://" + addressOf(t, s, service).String() + "/"
	if rollout {
		// A user waits for the Service's Route, not only its Revision,
		// before sending: the activators answer a Route whose
		// status.traffic is not written yet (or not yet seen by their
		// informers) with 503 route not ready.
		waitRouteTraffic(t, s, name, first+" 100%", time.Minute)
	}
	c := oneShotClient(10 * time.Second)
	e2etest.Eventually(t, time.Minute, url+" answers 200 ten times in a row", func() error {
		for range 10 { // new connections: every activator (or pod) is asked
			if a := get(c, url+"?sleep=1"); a.err != nil || a.code != 200 {
				return fmt.Errorf("answered %v", a)
			}
		}
		return nil
	})
	tl := startTimeline(t, s, service, first)
	// A steady load for the whole case: 2 + 2 short requests and 6 of
	// 5 s, 10 in flight: 2 pods at 5.6 a pod (target 8, 70 % of it) ...
	kinds := []string{"keep-alive 100 ms", "new-connection 100 ms", "keep-alive 5 s"}
	loads := []*loadgen.Load{
		loadgen.Start(ctx, loadgen.Options{URLs: []string{url + "?sleep=100"}, Concurrency: 2, KeepAlive: true, OnError: tl.failed(kinds[0])}),
		loadgen.Start(ctx, loadgen.Options{URLs: []string{url + "?sleep=100"}, Concurrency: 2, OnError: tl.failed(kinds[1])}),
		loadgen.Start(ctx, loadgen.Options{URLs: []string{url + "?sleep=5000"}, Concurrency: 6, KeepAlive: true, OnError: tl.failed(kinds[2])}),
	}
	defer func() {
		for _, l := range loads {
			l.Stop()
		}
	}()
	// ... and a burst of 36 more (46 in flight want 9 pods) that holds
	// the Revision at its 8 pods until it ends, as Knative's autoscale
	// sample is loaded with hey -c 50.
	kinds = append(kinds, "burst keep-alive 100 ms", "burst new-connection 100 ms")
	burst := []*loadgen.Load{
		loadgen.Start(ctx, loadgen.Options{URLs: []string{url + "?sleep=100"}, Concurrency: 18, KeepAlive: true, OnError: tl.failed(kinds[3])}),
		loadgen.Start(ctx, loadgen.Options{URLs: []string{url + "?sleep=100"}, Concurrency: 18, OnError: tl.failed(kinds[4])}),
	}
	loads = append(loads, burst...)
	e2etest.Eventually(t, 3*time.Minute, "8 ready pods of "+first, func() error {
		if n := readyPods(t, s, first, node); n != 8 {
			return fmt.Errorf("%d ready on %s", n, node)
		}
		return nil
	})
	time.Sleep(6 * time.Second) // 5 s requests in flight on every pod
	start := time.Now()
	leaving := 6
	if rollout {
		updateService(t, s, name, func(cur *servingv1alpha1.Service) { cur.Spec.Template.Spec.Containers[0].Env[0].Value = "v2" })
		waitLatestReady(t, s, name, name+"-00002", 3*time.Minute)
		waitRouteTraffic(t, s, name, name+"-00002 100%", 3*time.Minute)
		leaving = 8
		e2etest.Eventually(t, 3*time.Minute, "every pod of "+first+" gone", func() error {
			if n := podsOf(t, s, first); n != 0 {
				return fmt.Errorf("%d left", n)
			}
			return nil
		})
	} else {
		// The burst ends: the stable window sees 10 in flight, 2 pods.
		burst[0].Stop()
		burst[1].Stop()
		e2etest.Eventually(t, 3*time.Minute, first+" down to 2 pods", func() error {
			if n := podsOf(t, s, first); n != 2 {
				return fmt.Errorf("%d pods", n)
			}
			return nil
		})
	}
	t.Logf("%d pods left in %s under load", leaving, time.Since(start).Round(time.Second))
	time.Sleep(2 * time.Second) // the load goes on after the last one left
	for i, l := range loads {
		r := l.Stop()
		kind := kinds[i]
		t.Logf("%s: %d answered, %d failed", kind, r.Completed, r.Failed)
		if r.Failed > 0 || r.Completed == 0 {
			t.Errorf("%s: %d of %d requests failed; want none; the first: %v", kind, r.Failed, r.Completed+r.Failed, r.FirstError)
		}
	}
	loads = nil
	if t.Failed() {
		logLines(t, s, "activator", "forward failed", "unreachable")
	}
	return leaving
}

// logLines logs the lines of the last 5 minutes of the chart's pods of
// component that hold any of words: what a 502 was (the activators'
// "forward failed"), what the drains did (the real node's agent).
func logLines(t *testing.T, s *stack.Stack, component string, words ...string) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(shared.Config)
	if err != nil {
		t.Fatal(err)
	}
	var pods corev1.PodList
	if err := s.Client.List(context.Background(), &pods, client.InNamespace(stack.Namespace), client.MatchingLabels{"app.kubernetes.io/component": component}); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		b, err := cs.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{SinceSeconds: ptr.To(int64(300))}).DoRaw(context.Background())
		if err != nil {
			t.Logf("logs of %s: %v", p.Name, err)
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			for _, w := range words {
				if strings.Contains(line, w) {
					t.Logf("%s: %s", p.Name, line)
					break
				}
			}
		}
	}
}

// readyPods counts Revision rev's ready pods on node.
func readyPods(t *testing.T, s *stack.Stack, rev, node string) int {
	t.Helper()
	var pods corev1.PodList
	if err := s.Client.List(context.Background(), &pods, client.InNamespace(appNS), client.MatchingLabels{servingv1alpha1.RevisionLabelKey: rev}); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range pods.Items {
		if p.Spec.NodeName != node || p.DeletionTimestamp != nil {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				n++
			}
		}
	}
	return n
}

// podsOf counts Revision rev's pod objects, leaving ones too.
func podsOf(t *testing.T, s *stack.Stack, rev string) int {
	t.Helper()
	var pods corev1.PodList
	if err := s.Client.List(context.Background(), &pods, client.InNamespace(appNS), client.MatchingLabels{servingv1alpha1.RevisionLabelKey: rev}); err != nil {
		t.Fatal(err)
	}
	return len(pods.Items)
}
