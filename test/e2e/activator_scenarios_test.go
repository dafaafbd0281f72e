package e2e

import (
	"context"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/controller/api/v1alpha1"
	"github.com/sockscale/sockscale/test/stack"
)

// TestE2EActivatorDeadline: a request for a target whose pod never
// becomes ready is held for the target's timeoutSeconds (2), then
// answered 504 with a body naming the target and the timeout.
func TestE2EActivatorDeadline(t *testing.T) {
	s := up(t)
	const name = "never"
	url := deployUnready(t, s, stack.App{Name: name, Image: unknownImage, Spec: func(p *v1alpha1.PodAutoscalerSpec) {
		p.TimeoutSeconds = ptr(int32(2))
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

// TestE2EActivatorRefuses: requests sent straight to an activator pod
// are forwarded only to a known target's pods: an unknown Host gets a 404
// saying what was tried, Hosts naming a pod, the activator itself or the
// kubernetes API's ClusterIP get 404, an absolute-form URI naming another
// host gets 400, CONNECT gets 405.
func TestE2EActivatorRefuses(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	const name = "refuse"
	deploy(t, s, name, func(p *v1alpha1.PodAutoscalerSpec) { p.MinScale, p.MaxScale = ptr(int32(1)), ptr(int32(1)) })
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
	eventually(t, 20*time.Second, "the activator knows "+name, func() error { return activatorsKnow(ctx, s, name) })

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
