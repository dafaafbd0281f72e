package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// TestE2EActivatorColdStarts: two targets go to zero together (one wait
// for both), then
//   - 100 concurrent requests arriving at zero for a target with
//     containerConcurrency 1 and max-scale 10 are all answered 200 by at
//     most 10 pods, and no pod has more than 1 at once (one activator in
//     the path: a pod's one slot cannot be split, and an activator
//     without any would hold its requests for good at max-scale);
//   - one request at zero for a target with activation-scale 5 brings
//     exactly 5 pods.
func TestE2EActivatorColdStarts(t *testing.T) {
	s := up(t)
	// A 6 s window (the shortest): idle is noticed fast.
	window := &metav1.Duration{Duration: 6 * time.Second}
	deploy(t, s, "cold1", func(p *v1alpha1.PodAutoscalerSpec) {
		p.Window, p.ContainerConcurrency, p.MaxScale = window, 1, ptr.To(int32(10))
	})
	removeAtEnd(t, s, "cold1")
	deploy(t, s, "act5", func(p *v1alpha1.PodAutoscalerSpec) {
		p.Window, p.ActivationScale, p.MaxScale = window, ptr.To(int32(5)), ptr.To(int32(10))
	})
	removeAtEnd(t, s, "act5")
	waitAtZero(t, s, 3*time.Minute, "cold1", "act5")

	t.Run("100 requests at zero, containerConcurrency 1", func(t *testing.T) { hundredAtZero(t, s, "cold1") })
	t.Run("activation scale 5", func(t *testing.T) { activationScale(t, s, "act5", 5) })
}

func hundredAtZero(t *testing.T, s *stack.Stack, name string) {
	ctx := context.Background()
	url, err := s.PublicURL(ctx, appNS, name)
	if err != nil {
		t.Fatal(err)
	}
	const n = 100
	// Each request keeps its pod for 200 ms: two requests at one pod at
	// once would end within a few ms of each other, one after the other
	// at least 200 ms apart.
	const work = 200 * time.Millisecond
	var maxWanted, maxReady atomic.Int32
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watched sync.WaitGroup
	watched.Go(func() {
		for watchCtx.Err() == nil {
			if d, err := s.Deployment(ctx, appNS, name); err == nil {
				maxWanted.Store(max(maxWanted.Load(), *d.Spec.Replicas))
				maxReady.Store(max(maxReady.Load(), d.Status.ReadyReplicas))
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	timeline := watchActivators(watchCtx, s, name)
	c := oneShotClient(2 * time.Minute)
	answers := make([]answer, n)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i] = get(c, fmt.Sprintf("%s?sleep=%dms", url, work.Milliseconds())) })
	}
	wg.Wait()
	var last time.Duration
	byPod := map[string][]time.Time{}
	for i, a := range answers {
		last = max(last, a.end.Sub(start))
		if a.err != nil || a.code != http.StatusOK {
			t.Errorf("request %d at zero: %s, want 200 from a pod", i, a)
			continue
		}
		byPod[podOf(a.body)] = append(byPod[podOf(a.body)], a.end)
	}
	// The pods keep starting after the last answer: see how far it went.
	time.Sleep(2 * time.Second)
	stopWatch()
	watched.Wait()
	t.Logf("%d requests at zero answered by %d pods, the last after %s; the Deployment reached %d pods wanted, %d ready; %s",
		n, len(byPod), last.Round(time.Millisecond), maxWanted.Load(), maxReady.Load(), paLine(t, s, name))
	if got := maxWanted.Load(); got > 10 {
		t.Errorf("%d pods wanted, above max-scale 10", got)
	}
	if pa, err := s.PA(ctx, appNS, name); err != nil {
		t.Error(err)
	} else if len(pa.Status.Activators) != 1 {
		t.Errorf("activators in the path %v, want 1 (containerConcurrency 1)", pa.Status.Activators)
	}
	// containerConcurrency 1 holds, whatever pods the activator has seen
	// ready so far. Answers of one pod from one stream of requests end at
	// least a request's work apart, so k answers ending within half of it
	// (the clients' jitter allowed) mean k requests at that pod at once.
	for pod, ends := range byPod {
		slices.SortFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
		for i := range ends {
			k := 1
			for i+k < len(ends) && ends[i+k].Sub(ends[i]) < work/2 {
				k++
			}
			if k > 1 {
				t.Errorf("pod %s had %d requests at once (answers %v apart): more than its containerConcurrency of 1",
					pod, k, ends[i+k-1].Sub(ends[i]).Round(time.Millisecond))
			}
		}
	}
	counts := make([]int, 0, len(byPod))
	for _, ends := range byPod {
		counts = append(counts, len(ends))
	}
	slices.Sort(counts)
	t.Logf("answers per pod: %v", counts)
	t.Logf("the activators' view of %s, a line per change (per activator: held, at pods, ready pods, assigned pods, forwarded, unreachable):\n%s", name, strings.Join(timeline(), "\n"))
	if t.Failed() {
		t.Logf("the activators' warnings and errors since the requests were sent:\n%s", activatorWarnings(t, start))
	}
}

// activatorWarnings is the activators' log lines above INFO written since
// from (the last 40), read from the cluster's pod logs.
func activatorWarnings(t *testing.T, from time.Time) string {
	logs, _ := filepath.Glob(filepath.Join(shared.LogDir(), "pods", stack.Namespace+"_*activator*", "*.log"))
	var lines []string
	for _, path := range logs {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Log(err)
			continue
		}
		for line := range strings.Lines(string(b)) {
			var entry struct {
				Time  time.Time
				Level string
			}
			if json.Unmarshal([]byte(line), &entry) == nil && entry.Time.After(from) && entry.Level != "INFO" && entry.Level != "DEBUG" {
				lines = append(lines, filepath.Base(filepath.Dir(path))+" "+strings.TrimSpace(line))
			}
		}
	}
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

// watchActivators scrapes every activator's series of the target each
// 500 ms until ctx ends, and returns what they said: a line per change,
// for a failure's message (a stall shows where requests waited).
func watchActivators(ctx context.Context, s *stack.Stack, name string) (timeline func() []string) {
	var mu sync.Mutex
	var lines []string
	var done sync.WaitGroup
	start := time.Now()
	done.Go(func() {
		last := ""
		for ctx.Err() == nil {
			if line := activatorsLine(ctx, s, name); line != last {
				mu.Lock()
				lines = append(lines, fmt.Sprintf("%6.1fs %s", time.Since(start).Seconds(), line))
				mu.Unlock()
				last = line
			}
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	})
	return func() []string {
		done.Wait()
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(lines)
	}
}

// activatorsLine is each activator's state for the target: held, at
// pods, ready pods, assigned pods, forwarded and unreachable so far.
func activatorsLine(ctx context.Context, s *stack.Stack, name string) string {
	acts, err := s.Activators(ctx)
	if err != nil {
		return err.Error()
	}
	var parts []string
	target := map[string]string{"namespace": appNS, "name": name}
	with := func(k, v string) map[string]string {
		m := maps.Clone(target)
		m[k] = v
		return m
	}
	for _, a := range acts {
		if !a.IP.IsValid() {
			continue
		}
		m, err := s.Scrape(ctx, a.IP, stack.ActivatorMetricsPort)
		if err != nil {
			parts = append(parts, fmt.Sprintf("%s: %v", a.Name, err))
			continue
		}
		parts = append(parts, fmt.Sprintf("%s: %v %v %v %v %v %v", a.Name,
			stack.Sum(m, "sockscale_activator_requests_in_flight", with("state", "held")),
			stack.Sum(m, "sockscale_activator_requests_in_flight", with("state", "forwarded")),
			stack.Sum(m, "sockscale_activator_pods", with("state", "ready")),
			stack.Sum(m, "sockscale_activator_pods", with("state", "assigned")),
			stack.Sum(m, "sockscale_activator_hold_results_total", with("result", "forwarded")),
			stack.Sum(m, "sockscale_activator_hold_results_total", with("result", "pod_unreachable"))))
	}
	slices.Sort(parts)
	return strings.Join(parts, "; ")
}

func activationScale(t *testing.T, s *stack.Stack, name string, scale int32) {
	ctx := context.Background()
	url, err := s.PublicURL(ctx, appNS, name)
	if err != nil {
		t.Fatal(err)
	}
	// The request lasts milliseconds: a window later the target wants
	// fewer pods again, maybe before all of them are ready. What one
	// request at zero must do is make the target want, and create,
	// exactly activation-scale pods.
	var maxWanted, maxPods, maxReady int32
	poll := func() error {
		d, err := s.Deployment(ctx, appNS, name)
		if err != nil {
			return err
		}
		maxWanted, maxPods, maxReady = max(maxWanted, *d.Spec.Replicas), max(maxPods, d.Status.Replicas), max(maxReady, d.Status.ReadyReplicas)
		if maxWanted < scale || maxPods < scale {
			return fmt.Errorf("at most %d wanted, %d pods, %d ready: %s", maxWanted, maxPods, maxReady, paLine(t, s, name))
		}
		return nil
	}
	if got := replicas(t, s, name); got != 0 {
		t.Fatalf("%d pods wanted before the request, want 0", got)
	}
	a := get(oneShotClient(time.Minute), url)
	if a.err != nil || a.code != http.StatusOK {
		t.Fatalf("one request at zero: %s, want 200", a)
	}
	start := time.Now()
	e2etest.Eventually(t, 20*time.Second, fmt.Sprintf("%d pods after one request", scale), poll)
	for range 6 { // the next ticks (every 2 s) must not want more
		time.Sleep(500 * time.Millisecond)
		if err := poll(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("one request at zero answered in %s; %d pods wanted and created within %s (at most %d ready at once); %s",
		a.took.Round(time.Millisecond), maxPods, time.Since(start).Round(100*time.Millisecond), maxReady, paLine(t, s, name))
	if maxWanted != scale || maxPods != scale {
		t.Errorf("one request at zero: the target wanted up to %d pods and had up to %d, want exactly activation-scale %d", maxWanted, maxPods, scale)
	}
}

// TestE2EActivatorAlwaysInPath: with target-burst-capacity -1 the public
// endpoints stay the activators (their pod IPs, port 8012) while a ready
// pod serves, every request is answered through them; and a rolling
// restart of the activators under that load fails no request.
func TestE2EActivatorAlwaysInPath(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	const name = "inpath"
	url := deploy(t, s, name, func(p *v1alpha1.PodAutoscalerSpec) {
		p.TargetBurstCapacity, p.MinScale, p.MaxScale = ptr.To(-1.0), ptr.To(int32(1)), ptr.To(int32(3))
	})
	removeAtEnd(t, s, name)
	forwarded := map[string]string{"namespace": appNS, "name": name, "result": "forwarded"}
	_, before, err := activatorSum(ctx, s, "sockscale_activator_hold_results_total", forwarded)
	if err != nil {
		t.Fatal(err)
	}
	opts := loadgen.Options{URLs: []string{url + "?sleep=50"}, Concurrency: 4, KeepAlive: true}
	load := loadgen.Start(ctx, opts)
	defer load.Stop()
	time.Sleep(3 * time.Second)
	e2etest.Eventually(t, 20*time.Second, "the activators are the public endpoints with a pod ready", func() error {
		if got := ready(t, s, name); got < 1 {
			return fmt.Errorf("%d pods ready", got)
		}
		return expectActivatorEndpoints(ctx, s, name)
	})
	got, _, _ := publicEndpoints(ctx, s, name)
	t.Logf("under load with %d pods ready: public endpoints %v:%d; %s", ready(t, s, name), got, stack.ActivatorProxyPort, paLine(t, s, name))
	r := load.Stop()
	_, after, err := activatorSum(ctx, s, "sockscale_activator_hold_results_total", forwarded)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d requests answered (p50 %s, p99 %s), %d failed; the activators forwarded %v", r.Completed, r.Percentile(0.5).Round(100*time.Microsecond), r.Percentile(0.99).Round(100*time.Microsecond), r.Failed, after-before)
	if r.Failed > 0 || r.Completed == 0 {
		t.Errorf("%d of %d requests failed", r.Failed, r.Completed+r.Failed)
	}
	if after-before != float64(r.Completed) {
		t.Errorf("the activators forwarded %v requests, the client completed %d: not every request went through them", after-before, r.Completed)
	}

	// A rolling restart (kubectl rollout restart) under the same load.
	old := readyActivators(t, s, 2, time.Minute)
	load = loadgen.Start(ctx, opts)
	defer load.Stop()
	time.Sleep(2 * time.Second)
	start := time.Now()
	var d appsv1.Deployment
	key := types.NamespacedName{Namespace: stack.Namespace, Name: "sockscale-activator"}
	if err := s.Client.Get(ctx, key, &d); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(d.DeepCopy())
	if d.Spec.Template.Annotations == nil {
		d.Spec.Template.Annotations = map[string]string{}
	}
	d.Spec.Template.Annotations["kubectl.kubernetes.io/restartedAt"] = time.Now().Format(time.RFC3339)
	if err := s.Client.Patch(ctx, &d, patch); err != nil {
		t.Fatal(err)
	}
	e2etest.Eventually(t, 3*time.Minute, "the activators replaced", func() error {
		acts, err := s.Activators(ctx)
		if err != nil {
			return err
		}
		if len(acts) != len(old) {
			return fmt.Errorf("%d activator pods", len(acts))
		}
		for _, a := range acts {
			for _, o := range old {
				if a.Name == o.Name {
					return fmt.Errorf("old activator %s still there (ready %v, deleting %v)", a.Name, a.Ready, a.Deleting)
				}
			}
			if !a.Ready {
				return fmt.Errorf("new activator %s not ready", a.Name)
			}
		}
		return nil
	})
	rollout := time.Since(start)
	e2etest.Eventually(t, 20*time.Second, "the new activators are the public endpoints", func() error { return expectActivatorEndpoints(ctx, s, name) })
	time.Sleep(2 * time.Second)
	r = load.Stop()
	t.Logf("rolling restart of the activators took %s; under load: %d requests answered (p50 %s, p99 %s, max %s), %d failed",
		rollout.Round(100*time.Millisecond), r.Completed, r.Percentile(0.5).Round(100*time.Microsecond), r.Percentile(0.99).Round(time.Millisecond), r.Percentile(1).Round(time.Millisecond), r.Failed)
	if r.Failed > 0 || r.Completed == 0 {
		t.Errorf("%d of %d requests failed during the activators' rolling restart, want none", r.Failed, r.Completed+r.Failed)
	}
}

// TestE2EActivatorBurstCapacity7: target 10, target burst capacity 7,
// steady load of 10 in flight. The target value is 10 x 70 % = 7, so 10
// in flight want ceil(10/7) = 2 pods; with 2 ready pods EBC =
// floor(2 x 10 - 7 - 10) = 3 >= 0, so the pods themselves are the public
// endpoints (Serve); with 1 it would be 10 - 7 - 10 = -7 (Proxy).
// (Knative's version of this case sets containerConcurrency 10, which
// gives the same numbers; in sockscale a containerConcurrency keeps the
// activators in the path, TestE2EContainerConcurrencyIsAHardLimit.)
func TestE2EActivatorBurstCapacity7(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	const name = "tbc7"
	url := deploy(t, s, name, func(p *v1alpha1.PodAutoscalerSpec) {
		p.Target, p.TargetBurstCapacity, p.MaxScale = ptr.To(10.0), ptr.To(7.0), ptr.To(int32(5))
	})
	removeAtEnd(t, s, name)
	// A new connection per request, so traffic follows the public
	// endpoints as they switch between activators and pods.
	load := loadgen.Start(ctx, loadgen.Options{URLs: []string{url + "?sleep=200"}, Concurrency: 10})
	defer load.Stop()
	start := time.Now()
	e2etest.Eventually(t, 90*time.Second, "2 pods ready", func() error {
		if got := ready(t, s, name); got != 2 {
			return fmt.Errorf("%d ready: %s", got, paLine(t, s, name))
		}
		return nil
	})
	expectServeEndpoints(t, s, name)
	t.Logf("2 pods ready and serving after %s: %s", time.Since(start).Round(100*time.Millisecond), paLine(t, s, name))
	// Steady: it stays there.
	for range 10 {
		time.Sleep(time.Second)
		pa, err := s.PA(ctx, appNS, name)
		if err != nil {
			t.Fatal(err)
		}
		eps, _, err := publicEndpoints(ctx, s, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := replicas(t, s, name); got != 2 || pa.Status.Mode != v1alpha1.ModeServe || len(eps) != 2 {
			t.Fatalf("at steady load: %d pods wanted, %d public endpoints %v: %s; want 2 pods served directly", got, len(eps), eps, paLine(t, s, name))
		}
	}
	expectServeEndpoints(t, s, name)
	r := load.Stop()
	t.Logf("steady at 2 pods, Serve, 2 public endpoints: %s; %d requests, %d failed", paLine(t, s, name), r.Completed, r.Failed)
	if r.Failed > 0 {
		t.Errorf("%d of %d requests failed", r.Failed, r.Completed+r.Failed)
	}
}

// TestE2EActivatorDeadline: a request for a target whose pod never
// becomes ready is held for the target's timeoutSeconds (2), then
// answered 504 with a body naming the target and the timeout.
func TestE2EActivatorDeadline(t *testing.T) {
	s := up(t)
	const name = "never"
	url := deployUnready(t, s, stack.App{Name: name, Image: unknownImage, Spec: func(p *v1alpha1.PodAutoscalerSpec) {
		p.TimeoutSeconds = ptr.To(int32(2))
	}})
	a := get(oneShotClient(time.Minute), url)
	t.Logf("a request for %s/%s (image %s, timeoutSeconds 2): %s after %s", appNS, name, unknownImage, a, a.took.Round(time.Millisecond))
	if a.err != nil || a.code != http.StatusGatewayTimeout {
		t.Fatalf("got %s, want 504", a)
	}
	for _, want := range []string{appNS + "/" + name, "2s"} {
		if !strings.Contains(a.body, want) {
			t.Errorf("the 504's body %q does not say %q", strings.TrimSpace(a.body), want)
		}
	}
	if a.took < 2*time.Second || a.took > 4*time.Second {
		t.Errorf("answered after %s, want about the timeout (2 s)", a.took)
	}
}

// TestE2EActivatorQueueFull: with the activators' queue depth at 3, a
// fourth request held by the same activator for a target with no ready
// pod is answered 503 at once, with Retry-After and a body naming the
// target and the depth; the three held get their 504 at the target's
// timeout.
func TestE2EActivatorQueueFull(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	const name, depth = "full", 3
	start := time.Now()
	if err := s.Install(ctx, append(slices.Clone(chartSets), fmt.Sprintf("activator.queueDepth=%d", depth))...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Install(ctx, chartSets...); err != nil {
			t.Errorf("reinstall the chart as the package had it: %v", err)
		}
		readyActivators(t, s, 2, 2*time.Minute)
	})
	act := readyActivators(t, s, 2, 2*time.Minute)[0]
	t.Logf("activators restarted with --queue-depth=%d in %s", depth, time.Since(start).Round(100*time.Millisecond))
	deployUnready(t, s, stack.App{Name: name, Image: unknownImage, Spec: func(p *v1alpha1.PodAutoscalerSpec) {
		p.TimeoutSeconds = ptr.To(int32(5))
	}})
	localRoute(t, act.IP)
	proxy := netip.AddrPortFrom(act.IP, stack.ActivatorProxyPort)
	request := "GET / HTTP/1.1\r\nHost: " + name + "." + appNS + "\r\n"
	held := make([]answer, depth)
	var wg sync.WaitGroup
	for i := range held {
		wg.Go(func() { held[i] = raw(proxy, "GET", request) })
	}
	defer wg.Wait()
	e2etest.Eventually(t, 10*time.Second, fmt.Sprintf("%d held by %s", depth, act.Name), func() error {
		m, err := s.Scrape(ctx, act.IP, stack.ActivatorMetricsPort)
		if err != nil {
			return err
		}
		if got := stack.Sum(m, "sockscale_activator_requests_in_flight", map[string]string{"namespace": appNS, "name": name, "state": "held"}); got != depth {
			return fmt.Errorf("%v held", got)
		}
		return nil
	})
	a := raw(proxy, "GET", request)
	t.Logf("request %d: %s after %s, Retry-After %q", depth+1, a, a.took.Round(time.Millisecond), a.header.Get("Retry-After"))
	if a.err != nil || a.code != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" {
		t.Errorf("got %s (Retry-After %q), want 503 with Retry-After", a, a.header.Get("Retry-After"))
	}
	for _, want := range []string{"queue full", appNS + "/" + name, fmt.Sprint(depth)} {
		if !strings.Contains(a.body, want) {
			t.Errorf("the 503's body %q does not say %q", strings.TrimSpace(a.body), want)
		}
	}
	if a.took > time.Second {
		t.Errorf("the 503 came after %s, want it at once", a.took)
	}
	wg.Wait()
	for i, h := range held {
		if h.err != nil || h.code != http.StatusGatewayTimeout {
			t.Errorf("held request %d: %s, want 504 at the 5 s timeout", i, h)
		}
	}
	t.Logf("the %d held: %s after %s", depth, held[0], held[0].took.Round(time.Millisecond))
}

// TestE2EActivatorRefuses: requests sent straight to an activator pod
// are forwarded only to a known target's pods: an unknown Host gets a 404
// saying what was tried, Hosts naming a pod, the activator itself or the
// kubernetes API's ClusterIP get 404, an absolute-form URI naming another
// host gets 400, CONNECT gets 405, a request an activator already
// forwarded gets 508.
func TestE2EActivatorRefuses(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	const name = "refuse"
	deploy(t, s, name, func(p *v1alpha1.PodAutoscalerSpec) { p.MinScale, p.MaxScale = ptr.To(int32(1)), ptr.To(int32(1)) })
	removeAtEnd(t, s, name)
	act := readyActivators(t, s, 2, time.Minute)[0]
	localRoute(t, act.IP)
	proxy := netip.AddrPortFrom(act.IP, stack.ActivatorProxyPort)
	var pods corev1.PodList
	if err := s.Client.List(ctx, &pods, client.InNamespace(appNS), client.MatchingLabels{"app": name}); err != nil || len(pods.Items) == 0 || pods.Items[0].Status.PodIP == "" {
		t.Fatalf("a pod of %s with an IP: %v (%d pods)", name, err, len(pods.Items))
	}
	podIP := pods.Items[0].Status.PodIP
	var api corev1.Service
	if err := s.Client.Get(ctx, types.NamespacedName{Namespace: "default", Name: "kubernetes"}, &api); err != nil {
		t.Fatal(err)
	}
	apiHost := netip.AddrPortFrom(netip.MustParseAddr(api.Spec.ClusterIP), 443).String()
	e2etest.Eventually(t, 20*time.Second, "the activator knows "+name, func() error { return activatorsKnow(ctx, s, name) })

	for _, c := range []struct {
		what, method, request string
		code                  int
		body                  []string // the body says these
	}{
		{"the target by name (control)", "GET", "GET /?sleep=1 HTTP/1.1\r\nHost: refuse.e2e\r\n", 200, []string{"pod " + name}},
		{"the target by header (control)", "GET", "GET / HTTP/1.1\r\nHost: whatever\r\nSockscale-Target: e2e/refuse\r\n", 200, []string{"pod " + name}},
		{"an unknown host", "GET", "GET / HTTP/1.1\r\nHost: nothing.e2e.svc.cluster.local\r\n", 404, []string{"nothing.e2e.svc.cluster.local"}},
		{"an unknown target header", "GET", "GET / HTTP/1.1\r\nHost: refuse.e2e\r\nSockscale-Target: e2e/nothing\r\n", 404, []string{"e2e/nothing"}},
		{"a pod of the target by IP", "GET", "GET / HTTP/1.1\r\nHost: " + podIP + ":8080\r\n", 404, []string{podIP}},
		{"the kubernetes API's ClusterIP", "GET", "GET /api HTTP/1.1\r\nHost: " + apiHost + "\r\n", 404, []string{apiHost}},
		{"the activator itself", "GET", "GET /metrics HTTP/1.1\r\nHost: " + proxy.String() + "\r\n", 404, []string{proxy.String()}},
		{"an absolute URI naming the API, target by header", "GET", "GET http://" + apiHost + "/api HTTP/1.1\r\nHost: refuse.e2e\r\nSockscale-Target: e2e/refuse\r\n", 400, []string{apiHost, "not a forward proxy"}},
		{"an absolute URI naming the API, the target as Host", "GET", "GET http://" + apiHost + "/api HTTP/1.1\r\nHost: refuse.e2e\r\n", 404, []string{apiHost}},
		{"CONNECT to the API", "CONNECT", "CONNECT " + apiHost + " HTTP/1.1\r\nHost: " + apiHost + "\r\n", 405, []string{"CONNECT"}},
		{"CONNECT to the target", "CONNECT", "CONNECT refuse.e2e:80 HTTP/1.1\r\nHost: refuse.e2e:80\r\n", 405, []string{"CONNECT"}},
		{"a request already through an activator", "GET", "GET / HTTP/1.1\r\nHost: refuse.e2e\r\nSockscale-Proxied: " + act.Name + "\r\n", 508, []string{"already forwarded by a sockscale activator"}},
	} {
		a := raw(proxy, c.method, c.request)
		t.Logf("%s: %s", c.what, a)
		if a.err != nil || a.code != c.code {
			t.Errorf("%s: got %s, want %d", c.what, a, c.code)
			continue
		}
		for _, w := range c.body {
			if !strings.Contains(a.body, w) {
				t.Errorf("%s: the body %q does not say %q", c.what, strings.TrimSpace(a.body), w)
			}
		}
	}
}

// TestE2EActivatorKilledWhileHolding: 20 requests are held for a target
// whose pod cannot start (its image cannot be pulled); one activator is
// deleted with grace period 0. Only the requests it held fail; once the
// image is fixed, the other activator's are answered 200.
func TestE2EActivatorKilledWhileHolding(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	const name, n = "killed", 20
	url := deployUnready(t, s, stack.App{Name: name, Image: unknownImage})
	readyActivators(t, s, 2, time.Minute)

	c := oneShotClient(3 * time.Minute)
	answers := make([]answer, n)
	var done atomic.Int32
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			answers[i] = get(c, url)
			done.Add(1)
		})
	}
	defer wg.Wait()
	held := map[string]string{"namespace": appNS, "name": name, "state": "held"}
	var per map[string]float64
	e2etest.Eventually(t, 20*time.Second, fmt.Sprintf("%d requests held", n), func() error {
		var sum float64
		var err error
		if per, sum, err = activatorSum(ctx, s, "sockscale_activator_requests_in_flight", held); err != nil {
			return err
		}
		if sum != n {
			return fmt.Errorf("%v held (%v), %d answered", sum, per, done.Load())
		}
		return nil
	})
	victim := ""
	for a, v := range per {
		if v > 0 && (victim == "" || v > per[victim]) {
			victim = a
		}
	}
	lost := int(per[victim])
	t.Logf("held per activator: %v; deleting %s (grace period 0) with %d held", per, victim, lost)
	if err := s.Client.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: stack.Namespace, Name: victim}}, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	e2etest.Eventually(t, 30*time.Second, "the deleted activator's requests answered", func() error {
		if got := int(done.Load()); got < lost {
			return fmt.Errorf("%d answered", got)
		}
		return nil
	})
	// The others stay held: the target still has no pod.
	time.Sleep(2 * time.Second)
	if got := int(done.Load()); got != lost {
		t.Errorf("%d requests ended after the activator holding %d was deleted, want only those", got, lost)
	}

	var d appsv1.Deployment
	if err := s.Client.Get(ctx, types.NamespacedName{Namespace: appNS, Name: name}, &d); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(d.DeepCopy())
	d.Spec.Template.Spec.Containers[0].Image = stack.AppImage
	if err := s.Client.Patch(ctx, &d, patch); err != nil {
		t.Fatal(err)
	}
	fixed := time.Now()
	wg.Wait()
	seen := map[string]int{}
	ok, failed := 0, 0
	var slowest, lastFailed time.Duration
	for _, a := range answers {
		if a.err == nil && a.code == http.StatusOK {
			ok++
			slowest = max(slowest, a.end.Sub(fixed))
			continue
		}
		failed++
		lastFailed = max(lastFailed, a.end.Sub(killed))
		seen[a.String()]++
	}
	t.Logf("%d answered 200 (the last %s after the image was fixed), %d failed (the last %s after the delete); the failed clients saw %v",
		ok, slowest.Round(time.Millisecond), failed, lastFailed.Round(time.Millisecond), seen)
	if failed != lost || ok != n-lost {
		t.Errorf("%d failed and %d answered 200, want exactly the %d the deleted activator held to fail", failed, ok, lost)
	}
	// The Deployment replaces the activator; later scenarios need both.
	readyActivators(t, s, 2, time.Minute)
}
