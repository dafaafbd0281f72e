package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// TestE2EKeptAliveClientsLeaveTheActivators: 16 HTTP/1.1 clients that
// keep their connections alive connect to a target at zero, so every
// connection is an activator's; they are held through the cold start and
// answered. Once the target is in Serve (TBC 0), each activator answers
// a kept-alive client's next request with Connection: close, and the
// client's next connection goes to the pods: from 10 s after Serve on,
// none of their requests goes through an activator, and none failed. A
// 17th client sends one request at zero, whose answer says it was held
// through the cold start (Sockscale-Cold-Start), and then stays idle: its
// activator closes the connection once the target is served.
func TestE2EKeptAliveClientsLeaveTheActivators(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	const name, clients = "leave", 16
	url := deployUnready(t, s, stack.App{Name: name, Spec: func(p *v1alpha1.PodAutoscalerSpec) {
		p.InitialScale, p.MinScale, p.MaxScale = ptr.To(int32(0)), ptr.To(int32(0)), ptr.To(int32(2))
		p.TargetBurstCapacity = ptr.To(0.0)
	}})
	// One more client sends one request at zero and then keeps its
	// connection idle: the activator closes it once the target is served.
	idle := dialIdle(t, url)
	load := loadgen.Start(ctx, loadgen.Options{URLs: []string{url + "?sleep=20"}, Concurrency: clients, KeepAlive: true, Spans: true})
	defer load.Stop()
	if a := <-idle.answered; a.err != nil || a.code != 200 {
		t.Fatalf("the idle client's request at zero: %v", a)
	} else if held := a.header.Get(v1alpha1.ColdStartHeader); held == "" {
		t.Errorf("the answer to a request held through the cold start has no %s header (%v)", v1alpha1.ColdStartHeader, a.header)
	} else {
		t.Logf("the request held through the cold start: answered after %s, %s: %s", a.took.Round(time.Millisecond), v1alpha1.ColdStartHeader, held)
	}
	waitServe(t, s, name)
	serve := time.Now()
	idleClosed := make(chan time.Duration, 1)
	go func() { idleClosed <- idle.closed(30 * time.Second) }()
	forwarded := func() float64 {
		t.Helper()
		of := func(result string) float64 {
			_, sum, err := activatorSum(ctx, s, "sockscale_activator_hold_results_total", map[string]string{"namespace": appNS, "name": name, "result": result})
			if err != nil {
				t.Fatal(err)
			}
			return sum
		}
		return of("forwarded") - of("pod_unreachable")
	}
	atServe := forwarded()
	time.Sleep(10 * time.Second)
	from, before := time.Now(), forwarded()
	time.Sleep(5 * time.Second)
	after, to := forwarded(), time.Now()
	r := load.Stop()
	var inWindow int
	for _, sp := range r.Spans {
		if !sp.Start.Before(from) && sp.End.Before(to) {
			inWindow++
		}
	}
	t.Logf("%d kept-alive clients: %d answered, %d failed; the activators forwarded %v by Serve, %v in the 10 s after it, %v of the %d answered between %s and %s after it",
		clients, r.Completed, r.Failed, atServe, before-atServe, after-before, inWindow, from.Sub(serve).Round(100*time.Millisecond), to.Sub(serve).Round(100*time.Millisecond))
	if atServe == 0 {
		t.Errorf("the activators forwarded nothing before Serve: the clients did not connect to them at zero")
	}
	if inWindow == 0 || after-before != 0 {
		t.Errorf("from 10 s after Serve: %v of %d requests through the activators, want 0 of some", after-before, inWindow)
	}
	if r.Failed > 0 {
		t.Errorf("%d of %d requests failed; the first: %v", r.Failed, r.Completed+r.Failed, r.FirstError)
	}
	if d := <-idleClosed; d < 0 {
		t.Errorf("the idle kept-alive connection made at zero is still open 30 s after Serve")
	} else {
		t.Logf("the idle kept-alive connection made at zero was closed by its activator %s after Serve", d.Round(100*time.Millisecond))
	}
}

// waitServe waits up to 2 minutes for app name's PodAutoscaler to say
// Serve mode.
func waitServe(t *testing.T, s *stack.Stack, name string) {
	t.Helper()
	e2etest.Eventually(t, 2*time.Minute, name+" in Serve", func() error {
		pa, err := s.PA(context.Background(), appNS, name)
		if err != nil {
			return err
		}
		if pa.Status.Mode != v1alpha1.ModeServe {
			return fmt.Errorf("mode %q (%s)", pa.Status.Mode, pa.Status.ModeReason)
		}
		return nil
	})
}

// idleClient is one kept-alive HTTP/1.1 connection to a URL that sent
// one request (answered tells its answer) and then stays idle.
type idleClient struct {
	conn     net.Conn
	br       *bufio.Reader
	answered chan answer
}

// dialIdle connects to url's host, sends GET /?sleep=0 and reads the
// answer in the background.
func dialIdle(t *testing.T, url string) *idleClient {
	t.Helper()
	host := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/")
	conn, err := net.DialTimeout("tcp", host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &idleClient{conn: conn, br: bufio.NewReader(conn), answered: make(chan answer, 1)}
	start := time.Now()
	if _, err := fmt.Fprintf(conn, "GET /?sleep=0 HTTP/1.1\r\nHost: %s\r\n\r\n", host); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Minute))
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			c.answered <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		c.answered <- answer{code: resp.StatusCode, header: resp.Header, body: string(b), err: err, took: time.Since(start)}
	}()
	return c
}

// closed waits up to timeout for the server to close the connection and
// says how long it took; -1 if it did not.
func (c *idleClient) closed(timeout time.Duration) time.Duration {
	start := time.Now()
	_ = c.conn.SetReadDeadline(start.Add(timeout))
	if _, err := c.br.ReadByte(); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		return time.Since(start)
	}
	return -1
}

// TestE2EKeptAliveGRPCClientsLeaveTheActivators: the same with gRPC: one
// channel (one HTTP/2 connection) with 16 callers reaches a target at
// zero through an activator, its calls held through the cold start over
// h2c. Once the target has been in Serve for a while, the activator's
// next response on the connection starts a graceful GOAWAY: grpc-go
// connects again (to the pods), retries the streams the GOAWAY refused,
// and from 10 s after Serve on no call goes through an activator; none
// failed.
func TestE2EKeptAliveGRPCClientsLeaveTheActivators(t *testing.T) {
	t.Parallel() // with the package's other parallel scenarios, after the rest: it has its own app
	s := up(t)
	ctx := context.Background()
	const name, callers = "leave-grpc", 16
	url := deployUnready(t, s, stack.App{Name: name, Service: h2cService,
		Pod: func(p *corev1.PodSpec) {
			c := &p.Containers[0]
			c.Args = append(c.Args, fmt.Sprintf("--grpc-port=%d", grpcAppPort))
			c.Ports = append(c.Ports, corev1.ContainerPort{Name: "grpc", ContainerPort: grpcAppPort})
		},
		Spec: func(p *v1alpha1.PodAutoscalerSpec) {
			p.InitialScale, p.MinScale, p.MaxScale = ptr.To(int32(0)), ptr.To(int32(0)), ptr.To(int32(2))
			p.TargetBurstCapacity = ptr.To(0.0)
		}})
	c := dialGRPC(t, grpcAddr(url))
	load := startGRPCLoad(c, callers, "100ms")
	defer load.stop()
	waitServe(t, s, name)
	forwarded := func() float64 {
		t.Helper()
		_, sum, err := activatorSum(ctx, s, "sockscale_activator_hold_results_total", map[string]string{"namespace": appNS, "name": name, "result": "forwarded"})
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	count := func() int64 {
		load.mu.Lock()
		defer load.mu.Unlock()
		return load.completed
	}
	atServe := forwarded()
	time.Sleep(10 * time.Second)
	before, callsBefore := forwarded(), count()
	time.Sleep(5 * time.Second)
	after, callsAfter := forwarded(), count()
	load.stop()
	load.mu.Lock()
	failed := load.failed
	load.mu.Unlock()
	t.Logf("%d gRPC callers on one channel: the activators forwarded %v calls by Serve, %v in the 10 s after it, %v of the %d answered between 10 s and 15 s after it; %d connections dialled, %d calls failed",
		callers, atServe, before-atServe, after-before, callsAfter-callsBefore, c.dials.Load(), len(failed))
	if atServe == 0 {
		t.Errorf("the activators forwarded nothing before Serve: the channel did not connect to them at zero")
	}
	if callsAfter == callsBefore || after-before != 0 {
		t.Errorf("from 10 s after Serve: %v of %d calls through the activators, want 0 of some", after-before, callsAfter-callsBefore)
	}
	if c.dials.Load() < 2 {
		t.Errorf("the channel dialled %d connection(s), want a new one after the GOAWAY", c.dials.Load())
	}
	if len(failed) > 0 {
		t.Errorf("%d calls failed, the first: %v", len(failed), failed[0])
	}
}

// TestE2EHealthChecksAndQueueDepthAtZero: what the activators answer
// themselves for a target at zero, per its spec.activator:
//
//   - health checks (GET /healthz from an uptime checker's user agent)
//     are answered 200 by an activator, one every 500 ms for 10 s, and
//     the target stays at zero: no pod is made for them; a user's request
//     then wakes it and is answered by its pod, saying it was held
//     through the cold start;
//   - a target whose pod never becomes ready, with queueDepth 3, holds at
//     most 3 requests per activator; the rest are answered 503 with
//     Retry-After at once.
func TestE2EHealthChecksAndQueueDepthAtZero(t *testing.T) {
	t.Parallel() // with the package's other parallel scenarios, after the rest: it has its own apps
	s := up(t)
	ctx := context.Background()
	const checked, queued = "edge-checks", "edge-queue"
	atZero := func(p *v1alpha1.PodAutoscalerSpec) {
		p.InitialScale, p.MinScale, p.MaxScale = ptr.To(int32(0)), ptr.To(int32(0)), ptr.To(int32(1))
	}
	checkedURL := deployUnready(t, s, stack.App{Name: checked, Spec: func(p *v1alpha1.PodAutoscalerSpec) {
		atZero(p)
		p.Activator = &v1alpha1.ActivatorSpec{HealthChecks: &v1alpha1.HealthChecks{
			Paths: []v1alpha1.HealthCheckPath{"/healthz"}, UserAgents: []v1alpha1.HealthCheckUserAgent{"UptimeCheck"}}}
	}})
	queuedURL := deployUnready(t, s, stack.App{Name: queued, Image: unknownImage, Spec: func(p *v1alpha1.PodAutoscalerSpec) {
		atZero(p)
		p.Activator = &v1alpha1.ActivatorSpec{QueueDepth: ptr.To(int32(3))}
	}})

	// Health checks: answered by an activator, the target left at zero.
	c := oneShotClient(10 * time.Second)
	check := func(ua string) answer {
		req, err := http.NewRequest(http.MethodGet, checkedURL+"healthz", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("User-Agent", ua)
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			return answer{err: err}
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return answer{code: resp.StatusCode, header: resp.Header, body: string(b), err: err, took: time.Since(start)}
	}
	var answered int
	for range 20 {
		a := check("UptimeCheck/1.0 (+https://uptime.example)")
		if a.err != nil || a.code != http.StatusOK || a.header.Get("Sockscale-Health-Check") == "" {
			t.Errorf("health check at zero: %v %v, want 200 from an activator", a, a.header)
		} else {
			answered++
		}
		time.Sleep(500 * time.Millisecond)
	}
	pa := paOf(t, s, checked)
	if got := replicas(t, s, checked); got != 0 {
		t.Errorf("after 20 health checks at zero the Deployment wants %d pods, want 0: %s", got, paLine(t, s, checked))
	}
	t.Logf("%d of 20 health checks in 10 s answered by an activator; the target stayed at zero (desired %v, %d replicas)", answered, deref(pa.Status.DesiredScale), replicas(t, s, checked))
	// A user's request wakes it.
	user := get(oneShotClient(2*time.Minute), checkedURL+"?sleep=0")
	if user.err != nil || user.code != http.StatusOK || podOf(user.body) == "" {
		t.Errorf("a user's request at zero: %v, want it answered by a pod", user)
	} else if user.header.Get(v1alpha1.ColdStartHeader) == "" {
		t.Errorf("a user's request held through the cold start has no %s header: %v", v1alpha1.ColdStartHeader, user.header)
	} else {
		t.Logf("a user's request woke it: answered by %s after %s, %s: %s", podOf(user.body), user.took.Round(time.Millisecond), v1alpha1.ColdStartHeader, user.header.Get(v1alpha1.ColdStartHeader))
	}

	// Queue depth 3 per activator: send 3 per activator and 2 more.
	acts, err := s.Activators(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 3*len(acts) + 2
	reqCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	answers := make(chan answer, n)
	for range n {
		go func() {
			req, err := http.NewRequestWithContext(reqCtx, http.MethodGet, queuedURL, nil)
			if err != nil {
				answers <- answer{err: err}
				return
			}
			resp, err := oneShotClient(time.Minute).Do(req)
			if err != nil {
				answers <- answer{err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			answers <- answer{code: resp.StatusCode, header: resp.Header, body: string(b), err: err}
		}()
	}
	var refused []answer
	for wait := time.After(10 * time.Second); ; {
		select {
		case a := <-answers:
			refused = append(refused, a)
			continue
		case <-wait:
		}
		break
	}
	cancel()
	for _, a := range refused {
		if a.code != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" || !strings.Contains(a.body, "its queue depth") {
			t.Errorf("an answer while %d requests were held for a pod that never comes: %v %v, want 503 queue full with Retry-After", n, a, a.header)
		}
	}
	if len(refused) < 2 || len(refused) > n-3 {
		t.Errorf("%d of %d requests refused at once with %d activators of queue depth 3, want from 2 to %d", len(refused), n, len(acts), n-3)
	}
	t.Logf("%d requests for a target that never gets a ready pod, queue depth 3 on each of %d activators: %d answered 503 at once, %d held", n, len(acts), len(refused), n-len(refused))
}
