package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/test/cluster"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// activatorRoutePort is the activators' route port (the chart's default):
// a Route's address Services have it as their EndpointSlices' port.
const activatorRoutePort = 8013

// servingService is a serving Service of the test app: GREETING set to
// greeting (changing it makes a Revision) and the template's annotations.
func servingService(name, greeting string, annotations map[string]string) *servingv1alpha1.Service {
	return &servingv1alpha1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: name},
		Spec: servingv1alpha1.ServiceSpec{Template: servingv1alpha1.RevisionTemplateSpec{
			Metadata: servingv1alpha1.RevisionTemplateMetadata{Annotations: annotations},
			Spec: servingv1alpha1.RevisionSpec{Containers: []servingv1alpha1.Container{{
				Image: stack.AppImage,
				Env:   []corev1.EnvVar{{Name: "GREETING", Value: greeting}},
			}}},
		}},
	}
}

// createServing creates svc (and the namespace) and deletes it when the
// test ends: its Revisions, their Deployments and the Route go with it
// (owner references).
func createServing(t *testing.T, s *stack.Stack, svc *servingv1alpha1.Service) {
	t.Helper()
	ctx := context.Background()
	if err := s.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: appNS}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := s.Client.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Client.Delete(context.Background(), svc, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete Service %s: %v", svc.Name, err)
		}
	})
}

// updateService changes the Service's spec with change, retrying on
// conflicts with the controller's status writes.
func updateService(t *testing.T, s *stack.Stack, name string, change func(*servingv1alpha1.Service)) {
	t.Helper()
	e2etest.Eventually(t, 30*time.Second, "update Service "+name, func() error {
		var cur servingv1alpha1.Service
		if err := s.Client.Get(context.Background(), client.ObjectKey{Namespace: appNS, Name: name}, &cur); err != nil {
			return err
		}
		change(&cur)
		return s.Client.Update(context.Background(), &cur)
	})
}

// waitLatestReady waits until the Service's latest ready Revision is want
// and that Revision is Ready, and returns it. (The Service's own Ready
// may still be Unknown: a gradual rollout to it has just begun.)
func waitLatestReady(t *testing.T, s *stack.Stack, svc, want string, timeout time.Duration) *servingv1alpha1.Revision {
	t.Helper()
	ctx := context.Background()
	var rev servingv1alpha1.Revision
	e2etest.Eventually(t, timeout, "Service "+svc+": latest ready Revision "+want, func() error {
		var got servingv1alpha1.Service
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: svc}, &got); err != nil {
			return err
		}
		if got.Status.LatestReadyRevisionName != want {
			return fmt.Errorf("latest created %q, latest ready %q; %s", got.Status.LatestCreatedRevisionName, got.Status.LatestReadyRevisionName, servingDiag(ctx, s, svc))
		}
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: want}, &rev); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(rev.Status.Conditions, "Ready") {
			return fmt.Errorf("Revision %s not Ready: %s", want, stack.ConditionsLine(rev.Status.Conditions))
		}
		return nil
	})
	return &rev
}

// waitRouteTraffic waits until the Route's status.traffic reads want (as
// stack.TrafficLine writes it) and the Route is Ready.
func waitRouteTraffic(t *testing.T, s *stack.Stack, route, want string, timeout time.Duration) {
	t.Helper()
	ctx := context.Background()
	e2etest.Eventually(t, timeout, fmt.Sprintf("Route %s Ready with traffic %q", route, want), func() error {
		var rt servingv1alpha1.Route
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: route}, &rt); err != nil {
			return err
		}
		if got := stack.TrafficLine(rt.Status.Traffic); got != want || !meta.IsStatusConditionTrue(rt.Status.Conditions, "Ready") {
			return fmt.Errorf("traffic %q; %s", got, servingDiag(ctx, s, route))
		}
		return nil
	})
}

// addressOf is ClusterIP:80 of a Kubernetes Service in appNS (a Route's
// address, a tag's, a Revision's public Service), once it has one that
// stays on this machine.
func addressOf(t *testing.T, s *stack.Stack, name string) netip.AddrPort {
	t.Helper()
	var addr netip.AddrPort
	e2etest.Eventually(t, 30*time.Second, "Service "+name+"'s address", func() error {
		url, err := s.PublicURL(context.Background(), appNS, name)
		if err != nil {
			return err
		}
		addr, err = netip.ParseAddrPort(strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/"))
		return err
	})
	localRoute(t, addr.Addr())
	return addr
}

// servingDiag says where a serving Service stands, for a failure's
// message: its status, its Route's, each of its Revisions' routing state,
// readiness and PodAutoscaler, and the endpoints of the Route's
// addresses.
func servingDiag(ctx context.Context, s *stack.Stack, name string) string {
	var b strings.Builder
	var svc servingv1alpha1.Service
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: name}, &svc); err != nil {
		fmt.Fprintf(&b, "Service %s: %v", name, err)
	} else {
		fmt.Fprintf(&b, "Service %s: latest created %q ready %q, traffic [%s], %s", name, svc.Status.LatestCreatedRevisionName, svc.Status.LatestReadyRevisionName, stack.TrafficLine(svc.Status.Traffic), stack.ConditionsLine(svc.Status.Conditions))
	}
	var rt servingv1alpha1.Route
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: name}, &rt); err != nil {
		fmt.Fprintf(&b, "; Route: %v", err)
	} else {
		fmt.Fprintf(&b, "; Route: traffic [%s], %s, annotations %v", stack.TrafficLine(rt.Status.Traffic), stack.ConditionsLine(rt.Status.Conditions), rt.Annotations)
	}
	var revs servingv1alpha1.RevisionList
	if err := s.Client.List(ctx, &revs, client.InNamespace(appNS), client.MatchingLabels{servingv1alpha1.ServiceLabelKey: name}); err != nil {
		fmt.Fprintf(&b, "; Revisions: %v", err)
	}
	for _, r := range revs.Items {
		fmt.Fprintf(&b, "; Revision %s: routing %q, actual %v desired %v, %s", r.Name, r.Status.RoutingState, deref(r.Status.ActualReplicas), deref(r.Status.DesiredReplicas), stack.ConditionsLine(r.Status.Conditions))
		if pa, err := s.PA(ctx, appNS, r.Name); err == nil {
			fmt.Fprintf(&b, ", PodAutoscaler reachability %q mode %q desired %v actual %v", pa.Spec.Reachability, pa.Status.Mode, deref(pa.Status.DesiredScale), deref(pa.Status.ActualScale))
		}
	}
	var addrs corev1.ServiceList
	if err := s.Client.List(ctx, &addrs, client.InNamespace(appNS), client.MatchingLabels{servingv1alpha1.RouteLabelKey: name}); err == nil {
		for _, a := range addrs.Items {
			eps, ports, err := publicEndpoints(ctx, s, a.Name)
			fmt.Fprintf(&b, "; address %s (%s): endpoints %v ports %v (%v)", a.Name, a.Spec.ClusterIP, eps, ports, err)
		}
	}
	return b.String()
}

// expectRouteEndpoints: an address Service of a Route has the ready
// activators at their route port as its endpoints.
func expectRouteEndpoints(ctx context.Context, s *stack.Stack, service string) error {
	acts, err := s.Activators(ctx)
	if err != nil {
		return err
	}
	var want []string
	for _, a := range acts {
		if a.Ready && !a.Deleting {
			for _, ip := range a.IPs { // a dual-stack Service has a slice per family
				want = append(want, ip.String())
			}
		}
	}
	sortAddrs(want)
	got, ports, err := publicEndpoints(ctx, s, service)
	if err != nil {
		return err
	}
	if len(want) == 0 || fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("Service %s: endpoints %v, the ready activators %v", service, got, want)
	}
	for _, p := range ports {
		if p != activatorRoutePort {
			return fmt.Errorf("Service %s: endpoint port %d, want the activators' route port %d", service, p, activatorRoutePort)
		}
	}
	return nil
}

// waitRevisionAtZero waits until a Revision has no pod: its Deployment
// wants none and has none, no pod of it is left (terminating ones
// included), and its PodAutoscaler is in Proxy mode. check, if not nil,
// must hold too (e.g. the routing state).
func waitRevisionAtZero(t *testing.T, s *stack.Stack, rev string, timeout time.Duration, check func(*servingv1alpha1.Revision) error) {
	t.Helper()
	ctx := context.Background()
	e2etest.Eventually(t, timeout, "Revision "+rev+" at zero pods", func() error {
		var r servingv1alpha1.Revision
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: rev}, &r); err != nil {
			return err
		}
		if check != nil {
			if err := check(&r); err != nil {
				return err
			}
		}
		d, err := s.Deployment(ctx, appNS, r.Status.DeploymentName)
		if err != nil {
			return fmt.Errorf("Deployment %q: %w", r.Status.DeploymentName, err)
		}
		var pods corev1.PodList
		if err := s.Client.List(ctx, &pods, client.InNamespace(appNS), client.MatchingLabels{servingv1alpha1.RevisionLabelKey: rev}); err != nil {
			return err
		}
		pa, err := s.PA(ctx, appNS, rev)
		if err != nil {
			return err
		}
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 0 || d.Status.Replicas != 0 || len(pods.Items) != 0 || pa.Status.Mode != v1alpha1.ModeProxy {
			var names []string
			for _, p := range pods.Items {
				names = append(names, fmt.Sprintf("%s (%s, deleting %v)", p.Name, p.Status.Phase, p.DeletionTimestamp != nil))
			}
			return fmt.Errorf("Deployment wants %v and has %d, pods %v; %s", deref(d.Spec.Replicas), d.Status.Replicas, names, paLine(t, s, rev))
		}
		return nil
	})
}

// connResult is one new connection of a serving client, with one request
// on it.
type connResult struct {
	Target int       // index in the client's Targets
	At     time.Time // connect() about to be called
	// Dest is the connection's real destination: for an in-node client
	// the kernel's choice (its line in /proc/self/net/tcp), which differs
	// from the address dialled when connect4 rewrote it; otherwise the
	// address dialled.
	Dest netip.AddrPort `json:",omitzero"`
	Code int            `json:",omitempty"`
	Pod  string         `json:",omitempty"` // the pod that answered
	Took time.Duration
	Err  string `json:",omitempty"`
}

// revision is the Revision of the pod that answered: its Deployment is
// <rev>-deployment.
func (r connResult) revision() string {
	rev, _, _ := strings.Cut(r.Pod, "-deployment-")
	return rev
}

// servingClientConfig is what a serving client does: to each target, a
// new connection with one GET every Every until it is stopped, or, with
// Every 0, one to each in turn.
type servingClientConfig struct {
	Targets []netip.AddrPort
	Every   time.Duration
	Timeout time.Duration // of each connection; 0: loadTimeout
	// Host is the requests' Host header; empty: the address dialled.
	Host string `json:",omitempty"`
}

// oneConn connects to addr, sends GET / and reads the answer: an error
// unless a pod answered 200.
func oneConn(addr netip.AddrPort, host string, inNode bool, timeout time.Duration) connResult {
	r := connResult{At: time.Now()}
	// At is taken again just before connect(), as probe does.
	d := net.Dialer{Timeout: timeout, Control: func(string, string, syscall.RawConn) error {
		r.At = time.Now()
		return nil
	}}
	fail := func(err error) connResult {
		r.Err, r.Took = err.Error(), time.Since(r.At)
		return r
	}
	conn, err := d.Dial("tcp", addr.String())
	if err != nil {
		return fail(err)
	}
	defer conn.Close()
	r.Dest = addr
	if inNode {
		if r.Dest, err = stack.SocketDest(conn.(*net.TCPConn)); err != nil {
			return fail(err)
		}
	}
	_ = conn.SetDeadline(r.At.Add(timeout))
	if host == "" {
		host = addr.String()
	}
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n\r\n"); err != nil {
		return fail(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodGet})
	if err != nil {
		return fail(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fail(err)
	}
	r.Code, r.Pod, r.Took = resp.StatusCode, podOf(string(body)), time.Since(r.At)
	if r.Code != http.StatusOK || r.Pod == "" {
		r.Err = fmt.Sprintf("%s: %q", resp.Status, strings.TrimSpace(string(body)))
	}
	return r
}

// runConns makes cfg's connections until ctx ends (or once each, with
// Every 0), each paced start in a goroutine of its own (probeLoop), so a
// slow answer does not slow the rate.
func runConns(ctx context.Context, cfg servingClientConfig, inNode bool, emit func(connResult)) {
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = loadTimeout
	}
	each := func() {
		for i, a := range cfg.Targets {
			r := oneConn(a, cfg.Host, inNode, timeout)
			r.Target = i
			emit(r)
		}
	}
	if cfg.Every == 0 {
		each()
		return
	}
	probeLoop(ctx, cfg.Every, each)
}

// The serving client in a pod is this test binary run again
// (TestHelperServingClient), as the in-node client of redirect_test.go
// is: a line per connection on stdout; it stops when its stdin closes.
const (
	servingClientEnv     = "SOCKSCALE_E2E_SERVING_CLIENT"
	servingClientConn    = "serving-conn "
	servingClientRunning = "serving-running"
)

// TestHelperServingClient is not a test: it is the serving client's
// process (see clientSandbox) and returns at once unless it is that.
func TestHelperServingClient(t *testing.T) {
	cfgJSON := os.Getenv(servingClientEnv)
	if cfgJSON == "" {
		return
	}
	var cfg servingClientConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		t.Fatalf("$%s: %v", servingClientEnv, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	var mu sync.Mutex
	fmt.Println(servingClientRunning)
	runConns(ctx, cfg, true, func(r connResult) {
		b, _ := json.Marshal(r)
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf("%s%s\n", servingClientConn, b)
	})
}

// servingClient is a running serving client and what it measured.
type servingClient struct {
	who  string
	mu   sync.Mutex
	list []connResult
	stop func() // ends it (connections in flight finish); idempotent
}

func (c *servingClient) add(r connResult) {
	c.mu.Lock()
	c.list = append(c.list, r)
	c.mu.Unlock()
}

// results are its connections so far, in the order of their starts.
func (c *servingClient) results() []connResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := slices.Clone(c.list)
	slices.SortFunc(out, func(a, b connResult) int { return a.At.Compare(b.At) })
	return out
}

// startOutsideClient runs a serving client in the test process: on no
// node, so its connects go through kube-proxy alone.
func startOutsideClient(t *testing.T, cfg servingClientConfig) *servingClient {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	c := &servingClient{who: "outside"}
	go func() {
		defer close(done)
		runConns(ctx, cfg, false, c.add)
	}()
	var once sync.Once
	c.stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(c.stop)
	return c
}

// clientSandbox is a pod of its own on a node whose network namespace and
// cgroup (below the node's, where the node's agent attached its
// programs) serving clients run in, as `kubectl exec` would put them.
type clientSandbox struct {
	node, pod, netns, cgroup string
}

// newClientSandbox makes the pod <prefix>-<node> and waits until its
// sandbox exists; the pod is deleted when the test ends.
func newClientSandbox(t *testing.T, s *stack.Stack, prefix, node string) *clientSandbox {
	t.Helper()
	return newClientSandboxIn(t, s, appNS, prefix, node)
}

// newClientSandboxIn is newClientSandbox in namespace ns, the pod made by
// s's client (a tenant's, say).
func newClientSandboxIn(t *testing.T, s *stack.Stack, ns, prefix, node string) *clientSandbox {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: prefix + "-" + node, Labels: map[string]string{"app": prefix}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
			Containers: []corev1.Container{{
				Name: "app", Image: stack.AppImage, Args: []string{"--port=8080", "--shutdown-delay=0s"},
			}},
		},
	}
	if err := s.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Client.Delete(context.Background(), pod, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete pod %s: %v", pod.Name, err)
		}
	})
	b := &clientSandbox{node: node, pod: pod.Name}
	e2etest.Eventually(t, time.Minute, "the client pod "+pod.Name+" runs", func() error {
		if err := s.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		if pod.Status.PodIP == "" || len(pod.Status.ContainerStatuses) == 0 || pod.Status.ContainerStatuses[0].State.Running == nil {
			return fmt.Errorf("phase %s, IP %q", pod.Status.Phase, pod.Status.PodIP)
		}
		var err error
		if b.netns, b.cgroup, err = cluster.PodSandbox(pod); err != nil {
			return err
		}
		for _, p := range []string{"/run/netns/" + b.netns, b.cgroup} {
			if _, err := os.Stat(p); err != nil {
				return err
			}
		}
		return nil
	})
	return b
}

// command is the serving client's process in the sandbox; the caller
// closes the returned cgroup file once the process started.
func (b *clientSandbox) command(t *testing.T, cfg servingClientConfig) (*exec.Cmd, *os.File) {
	t.Helper()
	return b.helper(t, "TestHelperServingClient", servingClientEnv, cfg)
}

// helper is this test binary run again in the sandbox as the helper test
// (TestHelperServingClient, TestHelperInNodeClient) with env set to cfg
// in JSON; the caller closes the returned cgroup file once the process
// started.
func (b *clientSandbox) helper(t *testing.T, test, env string, cfg any) (*exec.Cmd, *os.File) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cg, err := os.Open(b.cgroup)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", b.netns, self, "-test.run=^"+test+"$", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), env+"="+string(js))
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd()), Pdeathsig: syscall.SIGKILL}
	return cmd, cg
}

// parseConn reads one line of the client's output: a connection, or not.
func parseConn(line string) (connResult, bool) {
	var r connResult
	rest, ok := strings.CutPrefix(line, servingClientConn)
	return r, ok && json.Unmarshal([]byte(rest), &r) == nil
}

// once runs the client in the sandbox for one connection to each target,
// in turn, and returns them.
func (b *clientSandbox) once(t *testing.T, timeout time.Duration, targets ...netip.AddrPort) []connResult {
	t.Helper()
	return b.onceAs(t, "", timeout, targets...)
}

// onceAs is once with host as every request's Host header.
func (b *clientSandbox) onceAs(t *testing.T, host string, timeout time.Duration, targets ...netip.AddrPort) []connResult {
	t.Helper()
	cmd, cg := b.command(t, servingClientConfig{Targets: targets, Timeout: timeout, Host: host})
	defer cg.Close()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	timer := time.AfterFunc(timeout*time.Duration(len(targets))+30*time.Second, func() {
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
		}
	})
	defer timer.Stop()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the serving client in %s on %s: %v\n%s", b.pod, b.node, err, stderr.String())
	}
	var rs []connResult
	for _, line := range strings.Split(string(out), "\n") {
		if r, ok := parseConn(line); ok {
			rs = append(rs, r)
		}
	}
	if len(rs) != len(targets) {
		t.Fatalf("the serving client in %s reported %d connections, want %d:\n%s\n%s", b.pod, len(rs), len(targets), out, stderr.String())
	}
	return rs
}

// start runs the client in the sandbox until stopped (or the test ends).
func (b *clientSandbox) start(t *testing.T, cfg servingClientConfig) *servingClient {
	t.Helper()
	cmd, cg := b.command(t, cfg)
	defer cg.Close()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &servingClient{who: b.node}
	read, running := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if sc.Text() == servingClientRunning {
				close(running)
			} else if r, ok := parseConn(sc.Text()); ok {
				c.add(r)
			}
		}
	}()
	var once sync.Once
	c.stop = func() {
		once.Do(func() {
			_ = stdin.Close()
			select {
			case <-read:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-read
				t.Errorf("the serving client on %s did not stop within 30 s: killed", b.node)
			}
			if err := cmd.Wait(); err != nil {
				t.Errorf("the serving client on %s: %v\n%s", b.node, err, stderr.String())
			}
		})
	}
	t.Cleanup(c.stop)
	select {
	case <-running:
	case <-read:
		t.Fatalf("the serving client on %s ended before it ran: %v\n%s", b.node, cmd.Wait(), stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the serving client on %s did not start within 30 s", b.node)
	}
	t.Logf("serving client: pid %d in pod %s on %s (netns %s), a new connection every %s to %v", cmd.Process.Pid, b.pod, b.node, b.netns, cfg.Every, cfg.Targets)
	return c
}

// servingWatch follows a serving Service and its Route of the same name
// as this test's watches see them: each change of the Route's
// status.traffic, and of either's Ready condition, with when it was seen.
type servingWatch struct {
	mu      sync.Mutex
	traffic []trafficSeen
	ready   []readySeen
}

type trafficSeen struct {
	at      time.Time
	traffic []servingv1alpha1.TrafficTargetStatus
}

type readySeen struct {
	at              time.Time
	kind            string // Route or Service
	status          metav1.ConditionStatus
	reason, message string
}

func (r readySeen) String() string {
	return fmt.Sprintf("%s %s Ready %s %s", r.at.Format("15:04:05.000"), r.kind, r.status, r.reason)
}

func watchServing(t *testing.T, s *stack.Stack, name string) *servingWatch {
	t.Helper()
	w := &servingWatch{}
	readyOf := func(kind string, cs []metav1.Condition) {
		c := meta.FindStatusCondition(cs, "Ready")
		seen := readySeen{at: time.Now(), kind: kind, status: "<none>"}
		if c != nil {
			seen.status, seen.reason, seen.message = c.Status, c.Reason, c.Message
		}
		for i := len(w.ready) - 1; i >= 0; i-- {
			if w.ready[i].kind == kind {
				if w.ready[i].status == seen.status && w.ready[i].reason == seen.reason {
					return
				}
				break
			}
		}
		w.ready = append(w.ready, seen)
	}
	watchNamed(t, s, &servingv1alpha1.RouteList{}, name, func(o client.Object) {
		rt := o.(*servingv1alpha1.Route)
		w.mu.Lock()
		defer w.mu.Unlock()
		if n := len(w.traffic); n == 0 || stack.TrafficLine(w.traffic[n-1].traffic) != stack.TrafficLine(rt.Status.Traffic) {
			w.traffic = append(w.traffic, trafficSeen{at: time.Now(), traffic: rt.Status.Traffic})
		}
		readyOf("Route", rt.Status.Conditions)
	})
	watchNamed(t, s, &servingv1alpha1.ServiceList{}, name, func(o client.Object) {
		w.mu.Lock()
		defer w.mu.Unlock()
		readyOf("Service", o.(*servingv1alpha1.Service).Status.Conditions)
	})
	return w
}

func (w *servingWatch) trafficChanges() []trafficSeen {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.traffic)
}

func (w *servingWatch) readyChanges() []readySeen {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.ready)
}

// watchNamed calls seen with each version of the object called name of
// list's kind in appNS (not its deletion) until the test ends, watching
// again when the server ends a watch.
func watchNamed(t *testing.T, s *stack.Stack, list client.ObjectList, name string, seen func(client.Object)) {
	t.Helper()
	wc, err := client.NewWithWatch(shared.Config, client.Options{Scheme: s.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	wt, err := wc.Watch(ctx, list, client.InNamespace(appNS))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for {
			for ev := range wt.ResultChan() {
				if o, ok := ev.Object.(client.Object); ok && o.GetName() == name && ev.Type != watch.Deleted {
					seen(o)
				}
			}
			wt.Stop()
			for {
				if ctx.Err() != nil {
					return
				}
				var err error
				if wt, err = wc.Watch(ctx, list, client.InNamespace(appNS)); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
}

// trafficStep is the split in effect from one change of status.traffic
// to the next: the share of one revision.
type trafficStep struct {
	at      time.Time
	percent int64
}

// steps are the changes of rev's share, in order.
func steps(changes []trafficSeen, rev string) []trafficStep {
	var out []trafficStep
	for _, c := range changes {
		p := stack.PercentOf(c.traffic, rev)
		if len(out) == 0 || out[len(out)-1].percent != p {
			out = append(out, trafficStep{at: c.at, percent: p})
		}
	}
	return out
}

// shareWindow compares the measured share of a revision with the
// schedule over a stretch of time.
type shareWindow struct {
	from, to time.Time
	steps    int // of the schedule, merged
	// scheduled is the percent each counted connection was made under,
	// averaged; measured is the percent of them the revision answered;
	// n counts them; tol is the largest difference allowed, in points.
	scheduled, measured, tol float64
	n                        int
}

func (w shareWindow) ok() bool { return math.Abs(w.measured-w.scheduled) <= w.tol }

// shareTolerance is the difference allowed between a measured share of n
// connections and the scheduled p (0..1), in percentage points: four
// binomial standard deviations of the share, sqrt(p(1-p)/n) (a window
// wrongly fails once in ~16,000), plus 3 points for what the schedule
// cannot say to the millisecond: when each node's agent applied a change
// (a window starts lag after the test's watch saw it, but an agent may
// be later, or earlier than the watch). Worked numbers: n = 200 at p =
// 0.5: 4 x 3.5 + 3 = 17 points; at p = 0.02: 4 x 1.0 + 3 = 7 points; at
// 0 or 1 (nothing may go the other way): 3 points.
func shareTolerance(p float64, n int) float64 {
	return 100*4*math.Sqrt(p*(1-p)/float64(n)) + 3
}

// shareWindows measures rev's share of the connections (successful ones
// only: failures are counted apart) step by step: the connections made
// from lag after a change to the next change (those in between may have
// been split either way) under that step's percent. Steps shorter than
// minLen are merged with the next ones until the window spans minLen,
// its scheduled share then the mean of its connections' percents (the
// time-weighted mean, as the connections are paced evenly). Connections
// from end on are not counted.
func shareWindows(sched []trafficStep, conns []connResult, rev string, lag, minLen time.Duration, from, end time.Time) []shareWindow {
	var out []shareWindow
	var cur *shareWindow
	var sum, hits float64
	closeWindow := func() {
		if cur.n > 0 {
			cur.scheduled, cur.measured = sum/float64(cur.n), 100*hits/float64(cur.n)
			cur.tol = shareTolerance(cur.scheduled/100, cur.n)
		}
		out = append(out, *cur)
		cur, sum, hits = nil, 0, 0
	}
	for k, st := range sched {
		lo, hi := st.at.Add(lag), end
		if k+1 < len(sched) {
			hi = sched[k+1].at
		}
		lo = later(lo, from)
		if !hi.After(lo) {
			continue // a step shorter than lag: none of it is counted
		}
		if cur != nil && hi.Sub(lo) >= minLen {
			// A long step (the first and the last, at 0 and 100 %) is a
			// window of its own: the short ones before it stay apart.
			closeWindow()
		}
		if cur == nil {
			cur = &shareWindow{from: lo}
		}
		cur.to = hi
		cur.steps++
		for _, c := range conns {
			if c.Err != "" || c.At.Before(lo) || !c.At.Before(hi) {
				continue
			}
			cur.n++
			sum += float64(st.percent)
			if c.revision() == rev {
				hits++
			}
		}
		if cur.to.Sub(cur.from) >= minLen {
			closeWindow()
		}
	}
	if cur != nil {
		closeWindow()
	}
	return out
}

func later(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}

// rolloutTotal adds up the windows scheduled strictly between 0 and
// 100 %: a systematic bias (an agent late by a second at every step, a
// skewed pick) hides in the windows' noise but not in the total. Its
// tolerance is four standard deviations of the total, the square root of
// the sum of the windows' binomial variances n p (1-p), plus 1 point.
// Worked numbers: 13 windows of 230 connections from 2 to 96 % have a
// variance of about 580 connections^2, so 4 x 24 / 2990 = 3.2 points,
// 4.2 with the 1.
func rolloutTotal(ws []shareWindow) shareWindow {
	var out shareWindow
	var sched, hits, variance float64
	for _, w := range ws {
		if w.n == 0 || w.scheduled <= 0 || w.scheduled >= 100 {
			continue
		}
		if out.n == 0 {
			out.from = w.from
		}
		n, p := float64(w.n), w.scheduled/100
		out.to, out.steps, out.n = w.to, out.steps+w.steps, out.n+w.n
		sched, hits, variance = sched+w.scheduled*n, hits+w.measured*n, variance+n*p*(1-p)
	}
	if out.n > 0 {
		n := float64(out.n)
		out.scheduled, out.measured, out.tol = sched/n, hits/n, 100*4*math.Sqrt(variance)/n+1
	}
	return out
}

// shareTable is the windows, then their total (if any), as a table,
// times from t0 in seconds.
func shareTable(ws []shareWindow, total shareWindow, t0 time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%9s %9s %6s %11s %10s %7s %11s\n", "start(s)", "end(s)", "steps", "scheduled%", "measured%", "conns", "tolerance")
	row := func(w shareWindow, label string) {
		if !w.ok() {
			label += "  OUT OF TOLERANCE"
		}
		fmt.Fprintf(&b, "%9.1f %9.1f %6d %11.1f %10.1f %7d %10.1f%s\n", w.from.Sub(t0).Seconds(), w.to.Sub(t0).Seconds(), w.steps, w.scheduled, w.measured, w.n, w.tol, label)
	}
	for _, w := range ws {
		row(w, "")
	}
	if total.n > 0 {
		row(total, "  all windows between 0 and 100 %")
	}
	return b.String()
}

// controllerLog is the controllers' log lines keep keeps, for a
// failure's message: without their stack traces and reconcile IDs, each
// distinct one once with its count, the last n of them.
func controllerLog(keep func(line string) bool, n int) string {
	out, err := exec.Command(filepath.Join(cluster.DefaultKubeBinDir(), "kubectl"), "--kubeconfig", shared.Kubeconfig,
		"logs", "-n", stack.Namespace, "-l", "app.kubernetes.io/component=controller", "--tail=-1").CombinedOutput()
	if err != nil {
		return fmt.Sprintf("kubectl logs: %v: %s", err, out)
	}
	reconcileID := regexp.MustCompile(`,"reconcileID":"[^"]*"|,"ts":"[^"]*"`)
	var lines []string
	count := map[string]int{}
	for _, line := range strings.Split(string(out), "\n") {
		if !keep(line) {
			continue
		}
		line, _, _ = strings.Cut(line, `,"stacktrace"`)
		line = reconcileID.ReplaceAllString(line, "")
		if count[line]++; count[line] == 1 {
			lines = append(lines, line)
		}
	}
	var b strings.Builder
	for _, line := range lines[max(0, len(lines)-n):] {
		fmt.Fprintf(&b, "%d x %s\n", count[line], line)
	}
	return b.String()
}
