package handler

import (
	"context"
	"math"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sockscale/sockscale/activator/internal/resolve"
	"github.com/sockscale/sockscale/activator/internal/target"
)

func rev(name string) target.Key { return target.Key{Namespace: "default", Name: name} }

// routeEnv: Route default/hello at 70/30 over hello-00001 (Serve mode)
// and hello-00002 (Proxy mode), tag "old" on hello-00003 at 0 % with no
// pod yet; the env's server is the route port (the table resolves with
// AllRevisions), proxy the proxy port (ProxiedFirst).
func routeEnv(t *testing.T) (e *env, proxy *httptest.Server, pods map[string]*pod) {
	t.Helper()
	e = newEnv(t, 0)
	pods = map[string]*pod{}
	for _, name := range []string{"hello-00001", "hello-00002", "hello-00003"} {
		p := newPod(t, hi)
		pods[name] = p
		tg := target.Target{Key: rev(name), Ports: []uint16{80}, Proxy: name == "hello-00002"}
		if name == "hello-00003" {
			e.serve(t, tg) // at zero
			continue
		}
		e.serve(t, tg, p.Server)
	}
	e.table.UpsertRoute(resolve.Route{Key: rev("hello"), Traffic: []resolve.Traffic{
		{Revision: "hello-00001", Percent: 70}, {Revision: "hello-00002", Percent: 30}, {Revision: "hello-00003", Tag: "old"}}})
	for _, s := range []resolve.RouteService{
		{Key: rev("hello"), Route: "hello", Ports: []uint16{80}, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.1.1")}},
		{Key: rev("old-hello"), Route: "hello", Tag: "old", Ports: []uint16{80}},
	} {
		if err := e.table.UpsertRouteService(s); err != nil {
			t.Fatal(err)
		}
	}
	proxy = httptest.NewServer(New(Options{PodName: "activator-0", Resolver: e.table.Picking(resolve.ProxiedFirst), Throttler: e.th, Stats: e.stats}))
	t.Cleanup(proxy.Close)
	return e, proxy, pods
}

// TestRouteHostByPort: a Route's host on the route port reaches its
// revisions by percent; on the proxy port only the revision in Proxy
// mode; a tag's host its revision at 0 %, which is held until it has a
// pod, on either port.
func TestRouteHostByPort(t *testing.T) {
	e, proxy, pods := routeEnv(t)
	ctx := context.Background()
	const n = 400
	for range n {
		if resp, body, err := e.get(t, ctx, "hello.default.svc.cluster.local"); err != nil || resp.StatusCode != 200 {
			t.Fatalf("route port: %v %v %q", err, resp, body)
		}
	}
	// Binomial(400, 0.7): sd 9.2, 5 sd = 46.
	got1, got2 := pods["hello-00001"].hits.Load(), pods["hello-00002"].hits.Load()
	if sd := math.Sqrt(n * 0.7 * 0.3); math.Abs(float64(got1)-0.7*n) > 5*sd || got1+got2 != n {
		t.Errorf("route port: hello-00001 got %d, hello-00002 %d of %d; want 280 ± %.0f and the rest", got1, got2, n, 5*sd)
	}

	pe := &env{srv: proxy}
	for range 100 {
		if resp, body, err := pe.get(t, ctx, "10.96.1.1:80"); err != nil || resp.StatusCode != 200 {
			t.Fatalf("proxy port: %v %v %q", err, resp, body)
		}
	}
	if d1, d2 := pods["hello-00001"].hits.Load()-got1, pods["hello-00002"].hits.Load()-got2; d1 != 0 || d2 != 100 {
		t.Errorf("proxy port: hello-00001 got %d, hello-00002 %d; want 0 and 100 (only the revision in Proxy mode)", d1, d2)
	}

	// The tag: held at zero, then its pod comes up.
	for _, srv := range []*env{e, pe} {
		done := make(chan string, 1)
		go func() {
			resp, body, err := srv.get(t, ctx, "old-hello.default:80")
			if err != nil {
				done <- err.Error()
				return
			}
			if resp.StatusCode != 200 {
				done <- resp.Status + " " + body
			}
			done <- ""
		}()
		waitFor(t, "the tag's request held", func() bool { return e.th.Held(rev("hello-00003")) == 1 })
		e.setPods(rev("hello-00003"), pods["hello-00003"].Server)
		select {
		case msg := <-done:
			if msg != "" {
				t.Errorf("tag host: %s", msg)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the tag's request was not answered once its revision had a pod")
		}
		e.setPods(rev("hello-00003"))
	}
	if got := pods["hello-00003"].hits.Load(); got != 2 {
		t.Errorf("hello-00003 got %d requests, want 2 (its tag's)", got)
	}
}

// TestRouteErrorAnswers: the activator answers a Route that says nowhere
// to go, and a revision it does not know, itself: 503 with Retry-After
// and a body naming the Route and why, counted by reason.
func TestRouteErrorAnswers(t *testing.T) {
	e, _, pods := routeEnv(t)
	tests := []struct {
		name    string
		traffic []resolve.Traffic
		host    string
		reason  string
		body    string
	}{
		{name: "no status.traffic", host: "hello.default", reason: reasonRouteNotReady,
			body: `host "hello.default" names Route default/hello, whose status.traffic is empty`},
		{name: "tag not in status.traffic", traffic: []resolve.Traffic{{Revision: "hello-00001", Percent: 100}}, host: "old-hello.default",
			reason: reasonRouteNotReady, body: `names tag "old" of Route default/hello, which is not in the Route's status.traffic`},
		{name: "revision unknown", traffic: []resolve.Traffic{{Revision: "hello-00009", Percent: 100}}, host: "hello.default",
			reason: reasonRouteRevisionUnknown, body: "whose revision hello-00009 is no target this activator knows"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.table.UpsertRoute(resolve.Route{Key: rev("hello"), Traffic: tt.traffic})
			before := e.errorResponses(t, 503, tt.reason)
			resp, body := raw(t, e.addr(), "GET / HTTP/1.1\nHost: "+tt.host+"\n\n")
			if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, tt.body) {
				t.Errorf("got %d (Retry-After %q) %q; want 503 with Retry-After and %q", resp.StatusCode, resp.Header.Get("Retry-After"), body, tt.body)
			}
			if got := e.errorResponses(t, 503, tt.reason) - before; got != 1 {
				t.Errorf("error_responses_total{code=503,reason=%s} rose by %v, want 1", tt.reason, got)
			}
		})
	}
	for name, p := range pods {
		if p.hits.Load() != 0 {
			t.Errorf("%s got %d requests: nothing may be forwarded elsewhere", name, p.hits.Load())
		}
	}
}

// TestRouteAbsoluteURI: with the target named by header, an absolute URI
// may name a Route whose split includes that target, and nothing else.
func TestRouteAbsoluteURI(t *testing.T) {
	e, _, _ := routeEnv(t)
	resp, body := raw(t, e.addr(), "GET http://hello.default/ HTTP/1.1\nHost: x\nSockscale-Target: default/hello-00001\n\n")
	if resp.StatusCode != 200 {
		t.Errorf("a Route host leading to the named target: %d %q, want 200", resp.StatusCode, body)
	}
	resp, body = raw(t, e.addr(), "GET http://old-hello.default/ HTTP/1.1\nHost: x\nSockscale-Target: default/hello-00001\n\n")
	if resp.StatusCode != 400 || !strings.Contains(body, "not target default/hello-00001") {
		t.Errorf("a tag host of another revision: %d %q, want 400", resp.StatusCode, body)
	}
}
