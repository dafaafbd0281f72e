package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/grpcsleep"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// The gRPC app: the autoscale image serving gRPC on grpcAppPort
// (--grpc-port), behind a public Service port with appProtocol
// kubernetes.io/h2c.
const (
	grpcAppPort = 9090
	// grpcPodMetadata is the header metadata in which the app names the
	// pod that answered (test/autoscale's PodMetadata).
	grpcPodMetadata = "x-pod"
)

// grpcPod is the gRPC app's pod spec on the real node: gRPC on its own
// port and the kubelet's gRPC readiness probe (the health service) every
// second. No HTTP probe: every probe the pod gets from the kubelet is a
// gRPC one, over HTTP/2.
func grpcPod(node string) func(*corev1.PodSpec) {
	return func(p *corev1.PodSpec) {
		stack.OnRealNode(node)(p)
		c := &p.Containers[0]
		c.Args = append(c.Args, fmt.Sprintf("--grpc-port=%d", grpcAppPort))
		c.Ports = append(c.Ports, corev1.ContainerPort{Name: "grpc", ContainerPort: grpcAppPort})
		c.ReadinessProbe = &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: grpcAppPort}},
			PeriodSeconds: 1,
		}
	}
}

// h2cService makes the public Service's one port the gRPC app's: port 80
// (the PodAutoscaler's) to the pods' gRPC port, with appProtocol
// kubernetes.io/h2c, so the activator speaks h2c to the pods.
func h2cService(spec *corev1.ServiceSpec) {
	spec.Ports = []corev1.ServicePort{{Name: "grpc", Port: 80, TargetPort: intstr.FromInt32(grpcAppPort), AppProtocol: ptr.To("kubernetes.io/h2c")}}
}

// grpcClient is one grpc-go channel to an address; it counts the TCP
// connections it dials.
type grpcClient struct {
	conn  *grpc.ClientConn
	dials atomic.Int64
}

func dialGRPC(t *testing.T, addr string) *grpcClient {
	t.Helper()
	c := &grpcClient{}
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			c.dials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, "tcp", a)
		}))
	if err != nil {
		t.Fatal(err)
	}
	c.conn = conn
	t.Cleanup(func() { conn.Close() })
	return c
}

// grpcAnswer is one Sleep call's outcome as its client saw it.
type grpcAnswer struct {
	pod  string
	err  error
	end  time.Time
	took time.Duration
}

// call makes one Sleep call that waits sleep on the server.
func (c *grpcClient) call(sleep string, timeout time.Duration) grpcAnswer {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	var resp wrapperspb.StringValue
	var md metadata.MD
	err := c.conn.Invoke(ctx, grpcsleep.Unary, wrapperspb.String(sleep), &resp, grpc.Header(&md))
	a := grpcAnswer{err: err, end: time.Now(), took: time.Since(start)}
	if err == nil && resp.Value != sleep {
		a.err = fmt.Errorf("answered %q to %q", resp.Value, sleep)
	}
	if pods := md.Get(grpcPodMetadata); len(pods) > 0 {
		a.pod = pods[0]
	}
	return a
}

// grpcLoad is a closed loop of clients on one channel: each makes a call
// as soon as its last one is answered.
type grpcLoad struct {
	stopping atomic.Bool
	wg       sync.WaitGroup

	mu        sync.Mutex
	completed int64
	failed    []error
	pods      map[string]int64 // calls answered by each pod
}

func startGRPCLoad(c *grpcClient, clients int, sleep string) *grpcLoad {
	l := &grpcLoad{pods: map[string]int64{}}
	for range clients {
		l.wg.Go(func() {
			for !l.stopping.Load() {
				a := c.call(sleep, 30*time.Second)
				l.mu.Lock()
				if a.err != nil {
					l.failed = append(l.failed, a.err)
				} else {
					l.completed++
					l.pods[a.pod]++
				}
				l.mu.Unlock()
			}
		})
	}
	return l
}

// stop lets the calls in flight finish and makes no more.
func (l *grpcLoad) stop() {
	l.stopping.Store(true)
	l.wg.Wait()
}

// TestE2EGRPCAutoscales: a gRPC service on the real node (a real kubelet
// probing it over gRPC) autoscales on its calls, each HTTP/2 stream one
// request, though all arrive on one connection:
//
//   - (d) idle, the kubelet's gRPC probes are counted as probes, not load;
//   - (a) 32 calls in flight on one channel scale it to ceil(32/(10 x 0.7))
//     = 5 pods, and it stays at 5 while they run (per-connection counting
//     would see 1 request in flight, and keep 1 pod);
//   - (b) once they stop it scales to zero;
//   - (c) calls at zero, over h2c through the activator, are all answered
//     by a pod it wakes, which an activator's h2c probe finds ready.
func TestE2EGRPCAutoscales(t *testing.T) {
	s := up(t)
	node := realNode(t)
	ctx := context.Background()
	const name = "grpc"
	const (
		clients = 32
		target  = 10.0
		want    = 5 // ceil(32 / (10 x 0.7))
	)
	began := time.Now()
	since := func() time.Duration { return time.Since(began).Round(100 * time.Millisecond) }
	realNodeRoom(t, s, node, want)

	url := e2etest.DeployApp(t, s, stack.App{Namespace: appNS, Name: name, Pod: grpcPod(node), Service: h2cService,
		Spec: func(p *v1alpha1.PodAutoscalerSpec) {
			p.Target, p.MaxScale = ptr.To(target), ptr.To(int32(8))
			// Its pods themselves behind the public Service while it has
			// some (Serve): the load's one connection reaches one pod.
			p.TargetBurstCapacity = ptr.To(0.0)
			// Idle is noticed within 10 s: (b) does not wait long.
			p.Window = &metav1.Duration{Duration: 10 * time.Second}
		}},
		func(url string) error {
			c := dialGRPC(t, grpcAddr(url))
			defer c.conn.Close()
			if a := c.call("0s", 5*time.Second); a.err != nil {
				return fmt.Errorf("call %s: %w", url, a.err)
			}
			return nil
		})
	removeAtEnd(t, s, name)
	addr := grpcAddr(url)
	pod := realPod(t, s, name, node)
	t.Logf("%s: deployed, pod %s ready and answering gRPC at %s", since(), pod.Name, addr)

	// (d) Idle: only the kubelet's gRPC readiness probe, once a second.
	series := func(pod string) *stack.PodSeries {
		t.Helper()
		m, err := s.AgentMetrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ps := m[appNS+"/"+pod]; ps != nil {
			return ps
		}
		t.Fatalf("no agent reports pod %s", pod)
		return nil
	}
	// The agent publishes what it read at its last report (every 1 s):
	// past two, the deploy's own calls are in the count.
	time.Sleep(2500 * time.Millisecond)
	idleFrom := series(pod.Name)
	const idle = 8 * time.Second
	time.Sleep(idle)
	idleTo := series(pod.Name)
	probes := idleTo.Values["sockscale_agent_probes_total"] - idleFrom.Values["sockscale_agent_probes_total"]
	requests := idleTo.Values["sockscale_agent_requests_total"] - idleFrom.Values["sockscale_agent_requests_total"]
	perConn := idleTo.Values["sockscale_agent_opaque_connections_total"] - idleFrom.Values["sockscale_agent_opaque_connections_total"]
	t.Logf("(d) %s idle on %s: %v kubelet gRPC probes counted as probes, %v requests counted, %v connections at connection level", idle, pod.Name, probes, requests, perConn)
	if probes < 5 {
		t.Errorf("(d) %v probes counted in %s idle, want the kubelet's gRPC probe once a second counted as a probe", probes, idle)
	}
	if requests != 0 || perConn != 0 {
		t.Errorf("(d) %v requests counted in %s with no load (%v connections at connection level): the kubelet's gRPC probes count as load", requests, idle, perConn)
	}

	// (a) 32 calls in flight on one channel, straight to the pod.
	expectServeEndpoints(t, s, name)
	c := dialGRPC(t, addr)
	loadFrom := series(pod.Name)
	load := startGRPCLoad(c, clients, "300ms")
	defer load.stop()
	loadStart := time.Now()
	e2etest.Eventually(t, 2*time.Minute, fmt.Sprintf("%d pods ready at %d calls in flight", want, clients), func() error {
		if got := ready(t, s, name); got < want {
			return fmt.Errorf("%d ready: %s", got, paLine(t, s, name))
		}
		return nil
	})
	reached := time.Since(loadStart)
	t.Logf("(a) %s: %d pods ready %s after the load began: %s", since(), want, reached.Round(100*time.Millisecond), paLine(t, s, name))
	// Held: the Deployment wants exactly 5 at every check, while the
	// loaded pod's agent sees every stream in flight.
	const hold = 20
	var maxInFlight float64
	modes := map[string]int{}
	for i := range hold {
		if got := replicas(t, s, name); got != want {
			t.Errorf("(a) %s into the hold at %d calls in flight: %d pods wanted, want %d: %s", time.Duration(i)*time.Second, clients, got, want, paLine(t, s, name))
			break
		}
		maxInFlight = max(maxInFlight, series(pod.Name).Values["sockscale_agent_requests_in_flight"])
		modes[accountingMode(t, s, node, pod.Name)]++
		time.Sleep(time.Second)
	}
	line := paLine(t, s, name)
	load.stop()
	loadTook := time.Since(loadStart)
	load.mu.Lock()
	completed, failed, answeredBy := load.completed, load.failed, load.pods
	load.mu.Unlock()
	// The agent's count of the pod's requests: every call, once its last
	// report has them (it reports every second), and nothing else (the
	// kubelet's probes are probes).
	var counted, proxied float64
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		to := series(pod.Name)
		counted = to.Values["sockscale_agent_requests_total"] - loadFrom.Values["sockscale_agent_requests_total"]
		proxied = to.Values["sockscale_agent_proxied_requests_total"] - loadFrom.Values["sockscale_agent_proxied_requests_total"]
		if (counted == float64(completed) && to.Values["sockscale_agent_requests_in_flight"] == 0) || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("(a) %s: %d calls of 300 ms in %s, %d failed, on %d connection(s), answered by %v; held at %d pods for %d s (%s); the pod's agent saw up to %v requests in flight, accounting mode %v; it counted %v requests (%v proxied)",
		since(), completed, loadTook.Round(100*time.Millisecond), len(failed), c.dials.Load(), answeredBy, want, hold, line, maxInFlight, modes, counted, proxied)
	if counted != float64(completed) {
		t.Errorf("(a) the loaded pod's agent counted %v requests, the client completed %d calls", counted, completed)
	}
	if len(failed) > 0 || completed == 0 {
		t.Errorf("(a) %d of %d calls failed, the first: %v", len(failed), completed+int64(len(failed)), failed[:min(len(failed), 3)])
	}
	// One connection reached one pod: the other four came for its
	// streams alone.
	if n := c.dials.Load(); n != 1 || len(answeredBy) != 1 || answeredBy[pod.Name] != completed {
		t.Errorf("(a) the load dialled %d connections and was answered by %v, want one connection answered by %s", n, answeredBy, pod.Name)
	}
	if maxInFlight < clients*7/8 {
		t.Errorf("(a) the loaded pod's agent saw at most %v requests in flight, want about %d (each stream a request)", maxInFlight, clients)
	}
	c.conn.Close()
	// Every pod of the target counted its connections per stream, the new
	// ones too: each was probed by the kubelet and the activators (over
	// h2c) from its first seconds, some before its agent had its address.
	m, err := s.AgentMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byPod := map[string]float64{}
	for key, ps := range m {
		if strings.HasPrefix(key, appNS+"/"+name+"-") {
			if n := ps.Values["sockscale_agent_opaque_connections_total"]; n > 0 {
				byPod[key] = n
			}
		}
	}
	if len(byPod) > 0 {
		t.Errorf("(a) connections counted at connection level, by pod: %v; want none (every connection HTTP/2, each stream a request)", byPod)
	}
	// What the controller shows of it.
	if pa, err := s.PA(ctx, appNS, name); err != nil {
		t.Fatal(err)
	} else if pa.Status.Accounting != v1alpha1.AccountingRequests {
		t.Errorf("(a) the PodAutoscaler's status.accounting is %q, want %q", pa.Status.Accounting, v1alpha1.AccountingRequests)
	}

	// (b) No load: down to zero.
	waitAtZero(t, s, 3*time.Minute, name)
	t.Logf("(b) %s: at zero: %s", since(), paLine(t, s, name))

	// (c) Calls at zero: one new channel, its connection to an activator
	// (Proxy mode), which holds them, wakes the target and sends them
	// over h2c to the pod its probe finds ready first.
	const atZero = 10
	zc := dialGRPC(t, addr)
	answers := make([]grpcAnswer, atZero)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i] = zc.call("100ms", 2*time.Minute) })
	}
	wg.Wait()
	var took []time.Duration
	var woke []string
	for i, a := range answers {
		if a.err != nil || a.pod == "" {
			t.Errorf("(c) call %d at zero: pod %q, %v; want it answered by a pod", i, a.pod, a.err)
			continue
		}
		took = append(took, a.end.Sub(start))
		if !slices.Contains(woke, a.pod) {
			woke = append(woke, a.pod)
		}
	}
	slices.Sort(took)
	e2etest.Eventually(t, time.Minute, "a ready pod after the calls at zero", func() error {
		if got := ready(t, s, name); got < 1 {
			return fmt.Errorf("%d ready", got)
		}
		return nil
	})
	_, probedReady, err := activatorSum(ctx, s, "sockscale_activator_pods_probed_ready_total", map[string]string{"namespace": appNS, "name": name})
	if err != nil {
		t.Fatal(err)
	}
	if len(took) > 0 {
		t.Logf("(c) %s: %d of %d calls at zero answered OK (first after %s, last after %s) by %v on %d connection(s); %s; pods found ready by an activator's h2c probe before their EndpointSlice: %v (each activator probes each pod)",
			since(), len(took), atZero, took[0].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), woke, zc.dials.Load(), paLine(t, s, name), probedReady)
	}
	// Every pod of the test started not ready in its EndpointSlice and
	// the activators probed it every 15 ms from then: over HTTP/1.1 none
	// would ever answer, over h2c they answer before the kubelet's
	// 1 s probe period is out.
	if probedReady < 1 {
		t.Errorf("(c) no pod of the h2c target was found ready by an activator's probe (%v), want the h2c probe to find them", probedReady)
	}
	t.Logf("%s in all", since())
}

// grpcAddr is the host:port of the public URL (http://<ClusterIP>:80/).
func grpcAddr(url string) string {
	return strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/")
}

// accountingMode is the real node agent's accounting mode for pod in its
// last period ("http", "http2" or "connection"; "" if none is 1).
func accountingMode(t *testing.T, s *stack.Stack, node, pod string) string {
	t.Helper()
	ctx := context.Background()
	var agents corev1.PodList
	if err := s.Client.List(ctx, &agents, client.InNamespace(stack.Namespace), stack.AgentPods); err != nil {
		t.Fatal(err)
	}
	for _, a := range agents.Items {
		if a.Spec.NodeName != node || a.Status.PodIP == "" {
			continue
		}
		ip, err := netip.ParseAddr(a.Status.PodIP)
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.Scrape(ctx, ip, stack.AgentMetricsPort)
		if err != nil {
			t.Fatal(err)
		}
		for _, smp := range m["sockscale_agent_accounting_mode"] {
			if smp.Labels["namespace"] == appNS && smp.Labels["pod"] == pod && smp.Value == 1 {
				return smp.Labels["mode"]
			}
		}
		return ""
	}
	t.Fatalf("no agent on %s", node)
	return ""
}

// realNodeRoom checks that the real node can take n more pods of the
// app: its allocatable pods, CPU and memory, less what the pods already
// there request, against n times what the app's pod requests.
func realNodeRoom(t *testing.T, s *stack.Stack, node string, n int) {
	t.Helper()
	ctx := context.Background()
	var nd corev1.Node
	if err := s.Client.Get(ctx, client.ObjectKey{Name: node}, &nd); err != nil {
		t.Fatal(err)
	}
	var pods corev1.PodList
	if err := s.Client.List(ctx, &pods, client.MatchingFields{"spec.nodeName": node}); err != nil {
		t.Fatal(err)
	}
	used := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("0"), corev1.ResourceMemory: resource.MustParse("0")}
	running := 0
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		running++
		addRequests(used, p.Spec)
	}
	app := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("0"), corev1.ResourceMemory: resource.MustParse("0")}
	spec := stack.AppPodSpec(stack.AppImage)
	grpcPod(node)(&spec)
	for range n {
		addRequests(app, spec)
	}
	alloc := nd.Status.Allocatable
	t.Logf("real node %s: allocatable %s CPU, %s memory, %s pods; %d pods there request %s CPU, %s memory; %d of the app request %s CPU, %s memory",
		node, alloc.Cpu(), alloc.Memory(), alloc.Pods(), running, used.Cpu(), used.Memory(), n, app.Cpu(), app.Memory())
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		need := used[r].DeepCopy()
		need.Add(app[r])
		if a := alloc[r]; need.Cmp(a) > 0 {
			t.Fatalf("real node %s: %s allocatable %s, requested %s with %d pods of the app", node, r, a.String(), need.String(), n)
		}
	}
	if int64(running+n) > alloc.Pods().Value() {
		t.Fatalf("real node %s: room for %d pods, %d there and %d to come", node, alloc.Pods().Value(), running, n)
	}
}

// addRequests adds the pod's containers' CPU and memory requests to l.
func addRequests(l corev1.ResourceList, spec corev1.PodSpec) {
	for _, c := range spec.Containers {
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if q, ok := c.Resources.Requests[r]; ok {
				sum := l[r]
				sum.Add(q)
				l[r] = sum
			}
		}
	}
}
