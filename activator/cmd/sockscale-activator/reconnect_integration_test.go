package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/owned"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationReconnectServedClients runs the activator against a real
// kube-apiserver with one target whose ServerlessService the test flips as
// the controller would. A keep-alive client on the proxy port keeps its
// connection while the target is in Proxy mode; once the ServerlessService
// says Serve (spec, status, Ready), the pod's answer carries Connection:
// close and the client connects again; back in Proxy, it keeps its
// connection again. The route port never asks.
func TestIntegrationReconnectServedClients(t *testing.T) {
	cl := testenv.ControlPlane(t)
	t.Setenv("POD_NAME", "activator-0")
	ctx0, cancel0 := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel0()
	c := cl.Client
	create := func(objs ...client.Object) {
		t.Helper()
		for _, o := range objs {
			if err := c.Create(ctx0, o); err != nil {
				t.Fatalf("create %T %s: %v", o, o.GetName(), err)
			}
		}
	}

	pod := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "hello") }))
	ln, err := net.Listen("tcp4", hostIPv4(t)+":0")
	if err != nil {
		t.Fatal(err)
	}
	pod.Listener = ln
	pod.Start()
	t.Cleanup(pod.Close)

	pa := &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: v1alpha1.PodAutoscalerSpec{
			ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "hello"},
			Service:        v1alpha1.ServiceRef{Name: "hello", Port: 80}}}
	create(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, pa)
	sks := owned.ServerlessService(&v1alpha1.ServerlessService{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeProxy, PublicService: "hello", Port: 80, Selector: map[string]string{"app": "hello"}}}, pa)
	create(sks)
	// setMode writes what the controller would for mode: the spec, then
	// the status with the Ready condition.
	setMode := func(mode v1alpha1.Mode) {
		t.Helper()
		if err := c.Get(ctx0, client.ObjectKeyFromObject(sks), sks); err != nil {
			t.Fatal(err)
		}
		sks.Spec.Mode = mode
		if err := c.Update(ctx0, sks); err != nil {
			t.Fatal(err)
		}
		sks.Status.Mode = mode
		sks.Status.Activators = nil
		if mode == v1alpha1.ModeProxy {
			sks.Status.Activators = []string{"activator-0"}
		}
		sks.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Mode", Message: string(mode),
			ObservedGeneration: sks.Generation, LastTransitionTime: metav1.Now()}}
		if err := c.Status().Update(ctx0, sks); err != nil {
			t.Fatal(err)
		}
	}
	setMode(v1alpha1.ModeProxy)
	private := owned.PrivateService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello-private"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}, Selector: map[string]string{"app": "hello"}}}, sks)
	create(private)
	create(podSlice(private, pod))

	// proxy, metrics, health, route ports.
	addrs := freeAddrs(t, 4)
	cfg, err := parseFlags([]string{"--proxy-bind-address=" + addrs[0], "--metrics-bind-address=" + addrs[1],
		"--health-probe-bind-address=" + addrs[2], "--route-bind-address=" + addrs[3], "--metrics-secure=false",
		"--network-policies=ignore", "--reconnect-served-after=0s",
		"--drain-delay=0s", "--shutdown-grace-period=1s", "--kubeconfig=" + cl.Kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, slog.New(slog.DiscardHandler)) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("run did not return after stop")
		}
	}()

	// One keep-alive client per port, counting its connections.
	type port struct {
		name, addr string
		client     *http.Client
		dials      *atomic.Int64
	}
	var ports []*port
	for _, p := range []struct{ name, addr string }{{"proxy", addrs[0]}, {"route", addrs[3]}} {
		dials := new(atomic.Int64)
		tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		}}
		defer tr.CloseIdleConnections()
		ports = append(ports, &port{p.name, p.addr, &http.Client{Transport: tr}, dials})
	}
	proxyPort, routePort := ports[0], ports[1]
	// get sends one request for the target; "" when the pod answered,
	// with whether the answer asked to close.
	get := func(p *port) (bool, string) {
		req, _ := http.NewRequestWithContext(ctx0, http.MethodGet, "http://"+p.addr+"/", nil)
		req.Host = "hello.default"
		resp, err := p.client.Do(req)
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(body) != "hello" {
			return resp.Close, fmt.Sprintf("%s port: %d %q", p.name, resp.StatusCode, body)
		}
		return resp.Close, ""
	}
	eventually := func(what string, cond func() string) {
		t.Helper()
		var last string
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if last = cond(); last == "" {
				return
			}
		}
		t.Fatalf("%s: still not so after 30 s: %s", what, last)
	}
	// kept checks that n requests on p are answered by the pod on one
	// connection.
	kept := func(p *port, n int) string {
		before := p.dials.Load()
		for range n {
			closing, problem := get(p)
			if problem != "" {
				return problem
			}
			if closing {
				return p.name + " port: asked to reconnect"
			}
		}
		if d := p.dials.Load() - before; d > 1 {
			return fmt.Sprintf("%s port: %d connections for %d requests", p.name, d, n)
		}
		return ""
	}

	eventually("the pod answers in Proxy mode, on kept connections", func() string {
		if s := kept(proxyPort, 5); s != "" {
			return s
		}
		return kept(routePort, 5)
	})

	setMode(v1alpha1.ModeServe)
	eventually("the proxy port asks its client to reconnect in Serve mode", func() string {
		closing, problem := get(proxyPort)
		if problem != "" {
			return problem
		}
		if !closing {
			return "not asked to reconnect"
		}
		return ""
	})
	before := proxyPort.dials.Load()
	if closing, problem := get(proxyPort); problem != "" || !closing {
		t.Errorf("proxy port in Serve mode: %q, close %v; want the pod's answer asking to reconnect", problem, closing)
	}
	if d := proxyPort.dials.Load() - before; d != 1 {
		t.Errorf("proxy port: %d new connections for a request after Connection: close, want 1", d)
	}
	if s := kept(routePort, 5); s != "" {
		t.Errorf("route port in Serve mode: %s", s)
	}
	resp, err := http.Get("http://" + addrs[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `sockscale_activator_reconnects_asked_total{namespace="default"}`) {
		t.Errorf("/metrics has no sockscale_activator_reconnects_asked_total for namespace default")
	}

	setMode(v1alpha1.ModeProxy)
	eventually("connections are kept again in Proxy mode", func() string { return kept(proxyPort, 5) })
}
