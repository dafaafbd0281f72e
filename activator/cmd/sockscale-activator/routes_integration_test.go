package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/owned"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

func TestRouteBindAddressDefault(t *testing.T) {
	t.Setenv("POD_NAME", "activator-0")
	c, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.routeAddr != ":8013" || c.proxyAddr != ":8012" {
		t.Errorf("--route-bind-address=%q --proxy-bind-address=%q, want :8013 and :8012", c.routeAddr, c.proxyAddr)
	}
}

// TestIntegrationRoutes runs the activator against a real kube-apiserver
// with a serving Route as the controller writes it: hello at 60/40 over
// hello-00001 (Serve) and hello-00002 (Proxy mode), tag "old" on
// hello-00003 at 0 % with no pod, and the Services hello and old-hello
// labelled with the Route. On the route port the Route's host spreads by
// percent; on the proxy port it goes only to the revision in Proxy mode;
// the tag's host reaches its revision at 0 %, held until it has a pod.
func TestIntegrationRoutes(t *testing.T) {
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

	// The revisions: public Service, PodAutoscaler, ServerlessService,
	// and a pod (an httptest server saying its revision's name) in the
	// private Service's EndpointSlice, but for hello-00003, at zero.
	podIP := hostIPv4(t)
	pods := map[string]*httptest.Server{}
	privates := map[string]*corev1.Service{}
	for _, rev := range []string{"hello-00001", "hello-00002", "hello-00003"} {
		pods[rev] = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, rev) }))
		ln, err := net.Listen("tcp4", podIP+":0")
		if err != nil {
			t.Fatal(err)
		}
		pods[rev].Listener = ln
		pods[rev].Start()
		t.Cleanup(pods[rev].Close)
		timeout := int32(30)
		pa := &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: rev},
			Spec: v1alpha1.PodAutoscalerSpec{
				ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: rev + "-deployment"},
				Service:        v1alpha1.ServiceRef{Name: rev, Port: 80}, TimeoutSeconds: &timeout}}
		create(
			&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: rev},
				Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}},
			pa,
		)
		mode := v1alpha1.ModeServe
		if rev != "hello-00001" {
			mode = v1alpha1.ModeProxy
		}
		// What the controller makes of the PodAutoscaler: its
		// ServerlessService and, from that, the private Service.
		sks := owned.ServerlessService(&v1alpha1.ServerlessService{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: rev},
			Spec: v1alpha1.ServerlessServiceSpec{Mode: mode, PublicService: rev, Port: 80, Selector: map[string]string{"rev": rev}}}, pa)
		create(sks)
		sks.Status.Mode = mode
		sks.Status.Activators = []string{"activator-0"}
		if err := c.Status().Update(ctx0, sks); err != nil {
			t.Fatal(err)
		}
		privates[rev] = owned.PrivateService(&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: rev + "-private"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}, Selector: map[string]string{"rev": rev}}}, sks)
		create(privates[rev])
		if rev != "hello-00003" {
			create(podSlice(privates[rev], pods[rev]))
		}
	}
	percent := func(p int64) *int64 { return &p }
	route := &servingv1alpha1.Route{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: servingv1alpha1.RouteSpec{Traffic: []servingv1alpha1.TrafficTarget{
			{RevisionName: "hello-00001", Percent: percent(60)},
			{RevisionName: "hello-00002", Percent: percent(40)},
			{RevisionName: "hello-00003", Tag: "old", Percent: percent(0)},
		}}}
	create(route)
	route.Status.Traffic = []servingv1alpha1.TrafficTargetStatus{
		{RevisionName: "hello-00001", Percent: percent(60)},
		{RevisionName: "hello-00002", Percent: percent(40)},
		{RevisionName: "hello-00003", Tag: "old", Percent: percent(0)},
	}
	if err := c.Status().Update(ctx0, route); err != nil {
		t.Fatal(err)
	}
	routeSvc := func(name, tag string) *corev1.Service {
		l := map[string]string{servingv1alpha1.RouteLabelKey: "hello"}
		if tag != "" {
			l[servingv1alpha1.TagLabelKey] = tag
		}
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: l},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	}
	addrSvc, tagSvc := routeSvc("hello", ""), routeSvc("old-hello", "old")
	create(addrSvc, tagSvc) // the API server assigns their ClusterIPs

	// proxy, metrics, health, route ports.
	addrs := freeAddrs(t, 4)
	cfg, err := parseFlags([]string{"--proxy-bind-address=" + addrs[0], "--metrics-bind-address=" + addrs[1],
		"--health-probe-bind-address=" + addrs[2], "--route-bind-address=" + addrs[3],
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

	// get sends one request with this Host to addr and returns the code
	// and body (the revision's name when a pod answered).
	get := func(addr, host string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx0, http.MethodGet, "http://"+addr+"/", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
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
	eventually("ready", func() string {
		resp, err := http.Get("http://" + addrs[2] + "/readyz")
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		if body, _ := io.ReadAll(resp.Body); resp.StatusCode != 200 {
			return string(body)
		}
		return ""
	})
	// Every revision with traffic has its pod, and the Route is known.
	eventually("both revisions answer through the Route", func() string {
		seen := map[string]bool{}
		for range 40 {
			code, body := get(addrs[3], "hello.default")
			if code != 200 {
				return fmt.Sprintf("%d %s", code, body)
			}
			seen[body] = true
		}
		if !seen["hello-00001"] || !seen["hello-00002"] {
			return fmt.Sprintf("answered by %v", seen)
		}
		return ""
	})

	// Route port: 60/40 per request, whatever form of the Route's address.
	const n = 400
	hosts := []string{"HELLO.default.", "hello.default:80", "hello.default.svc", "hello.default.svc.cluster.local:80", addrSvc.Spec.ClusterIP + ":80"}
	count := map[string]int{}
	for i := range n {
		code, body := get(addrs[3], hosts[i%len(hosts)])
		if code != 200 {
			t.Fatalf("route port, host %s: %d %s", hosts[i%len(hosts)], code, body)
		}
		count[body]++
	}
	// Binomial(400, 0.6): sd = sqrt(400 * 0.6 * 0.4) = 9.8; within 5 sd
	// fails a correct split with probability under 1e-6.
	if sd := math.Sqrt(n * 0.6 * 0.4); math.Abs(float64(count["hello-00001"])-0.6*n) > 5*sd || count["hello-00001"]+count["hello-00002"] != n {
		t.Errorf("route port: %v of %d, want hello-00001 %.0f ± %.0f (5 sd) and the rest hello-00002", count, n, 0.6*n, 5*sd)
	}

	// Proxy port: the kernel chose a revision in Proxy mode; only
	// hello-00002 is (hello-00001 is Serve with a ready pod).
	count = map[string]int{}
	for i := range 100 {
		code, body := get(addrs[0], hosts[i%len(hosts)])
		if code != 200 {
			t.Fatalf("proxy port, host %s: %d %s", hosts[i%len(hosts)], code, body)
		}
		count[body]++
	}
	if count["hello-00002"] != 100 {
		t.Errorf("proxy port: %v, want all 100 to hello-00002 (the revision in Proxy mode)", count)
	}

	// The tag's host reaches hello-00003 at 0 %, held while it has no
	// pod, on either port.
	type answer struct {
		code int
		body string
	}
	held := make(chan answer, 2)
	for _, a := range []string{addrs[3], addrs[0]} {
		go func() {
			code, body := get(a, "old-hello.default.svc.cluster.local")
			held <- answer{code, body}
		}()
	}
	time.Sleep(500 * time.Millisecond) // both held: the revision has no pod
	select {
	case a := <-held:
		t.Fatalf("the tag's request was answered before its revision had a pod: %d %s", a.code, a.body)
	default:
	}
	create(podSlice(privates["hello-00003"], pods["hello-00003"]))
	for range 2 {
		select {
		case a := <-held:
			if a.code != 200 || a.body != "hello-00003" {
				t.Errorf("tag host once its revision has a pod: %d %q, want 200 from hello-00003", a.code, a.body)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the tag's held request was not answered after its revision got a pod")
		}
	}
	for _, a := range []string{addrs[3], addrs[0]} {
		if code, body := get(a, tagSvc.Spec.ClusterIP+":80"); code != 200 || body != "hello-00003" {
			t.Errorf("tag Service's ClusterIP on %s: %d %q, want 200 from hello-00003", a, code, body)
		}
	}

	// A Route without status.traffic: 503 naming it, nothing forwarded.
	route.Status.Traffic = nil
	if err := c.Status().Update(ctx0, route); err != nil {
		t.Fatal(err)
	}
	eventually("a Route without status.traffic gets a 503 naming it", func() string {
		code, body := get(addrs[3], "hello.default")
		if code != 503 || !strings.Contains(body, "Route default/hello, whose status.traffic is empty") {
			return fmt.Sprintf("%d %s", code, body)
		}
		return ""
	})
}

// hostIPv4 is a non-loopback IPv4 address of this host, for the pods:
// the API server refuses loopback addresses in EndpointSlices.
func hostIPv4(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	t.Fatalf("no non-loopback IPv4 address among %v: the pods' EndpointSlices need one", addrs)
	return ""
}

// podSlice is the EndpointSlice Kubernetes computes for a revision's
// private Service with the pod srv, ready.
func podSlice(private *corev1.Service, srv *httptest.Server) *discoveryv1.EndpointSlice {
	ap := netip.MustParseAddrPort(srv.Listener.Addr().String())
	name, port, ready := "http", int32(ap.Port()), true
	return owned.ComputedSlice(&discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: private.Name + "-abcde"},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ap.Addr().String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port}},
	}, private)
}
