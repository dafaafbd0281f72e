package handler

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockscale/sockscale/activator/internal/holdpool"
	"github.com/sockscale/sockscale/activator/internal/resolve"
	"github.com/sockscale/sockscale/activator/internal/target"
	"github.com/sockscale/sockscale/activator/internal/throttle"
	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/activatorprobe"
)

var hello = target.Key{Namespace: "default", Name: "hello"}

// env is an activator on a real listener, with the real resolution table
// and throttle, in front of httptest pods.
type env struct {
	table *resolve.Table
	th    *throttle.Throttler
	stats *countingStats
	reg   *prometheus.Registry
	srv   *httptest.Server
	stop  context.CancelCauseFunc
}

func newEnv(t *testing.T, queueDepth int) *env {
	t.Helper()
	return newEnvWithPool(t, queueDepth, nil)
}

// newEnvWithPool is newEnv whose held requests share pool (nil: the
// handler's default pool).
func newEnvWithPool(t *testing.T, queueDepth int, pool *holdpool.Pool) *env {
	t.Helper()
	return newEnvWithAdmitter(t, queueDepth, pool, nil)
}

// newEnvWithAdmitter is newEnvWithPool that asks admitter before every
// forward (nil: none).
func newEnvWithAdmitter(t *testing.T, queueDepth int, pool *holdpool.Pool, admitter Admitter) *env {
	t.Helper()
	return newEnvWithOptions(t, queueDepth, func(o *Options) { o.Pool, o.Admitter = pool, admitter })
}

// newEnvWithOptions is newEnv whose handler's options edit changes (the
// table, throttle, stats and registry are the env's).
func newEnvWithOptions(t *testing.T, queueDepth int, edit func(*Options)) *env {
	t.Helper()
	base, stop := context.WithCancelCause(context.Background())
	e := &env{
		table: resolve.NewTable(""),
		th:    throttle.New(throttle.Options{Self: "activator-0", QueueDepth: queueDepth}),
		stats: &countingStats{},
		reg:   prometheus.NewRegistry(),
		stop:  stop,
	}
	o := Options{PodName: "activator-0", Resolver: e.table, Throttler: e.th, Stats: e.stats, Registerer: e.reg}
	if edit != nil {
		edit(&o)
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(o.Registerer)
	}
	h := New(o)
	e.srv = httptest.NewUnstartedServer(h)
	e.srv.Config = NewServer("", h, base)
	if o.Modes != nil {
		// As the proxy port is wired: idle connections are moved too.
		conns := NewConns(o.Modes, o.ReconnectAfter, o.Metrics, nil)
		conns.Attach(e.srv.Config)
		e.srv.Listener = conns.Listener(e.srv.Listener)
		go conns.Run(base)
	}
	e.srv.Start()
	t.Cleanup(func() {
		stop(nil)
		e.srv.Close()
		if b, n := e.stats.begun.Load(), e.stats.ended.Load(); b != n {
			t.Errorf("stats: %d requests begun, %d ended", b, n)
		}
	})
	return e
}

// serve registers a target whose ready pods are the given servers.
func (e *env) serve(t *testing.T, tg target.Target, pods ...*httptest.Server) {
	t.Helper()
	if err := e.table.Upsert(tg); err != nil {
		t.Fatal(err)
	}
	if err := e.th.Update(tg.Key, throttle.Settings{ContainerConcurrency: tg.ContainerConcurrency}); err != nil {
		t.Fatal(err)
	}
	e.setPods(tg.Key, pods...)
}

func (e *env) setPods(k target.Key, pods ...*httptest.Server) {
	var addrs []netip.AddrPort
	for _, p := range pods {
		addrs = append(addrs, netip.MustParseAddrPort(p.Listener.Addr().String()))
	}
	e.th.SetPods(k, addrs)
}

func (e *env) addr() string { return e.srv.Listener.Addr().String() }

func (e *env) get(t *testing.T, ctx context.Context, host string, hdr ...string) (*http.Response, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.srv.URL+"/path?q=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, string(body), err
}

func (e *env) waitHeld(t *testing.T, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d held", n), func() bool { return e.th.Held(hello) == n })
}

// waitFor polls cond: the events it waits for happen on the server's
// goroutines, out of the test's sight.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

type countingStats struct{ begun, ended atomic.Int64 }

func (s *countingStats) Begin(target.Key) func() {
	s.begun.Add(1)
	return func() { s.ended.Add(1) }
}

// pod is a backend that records what reaches it.
type pod struct {
	*httptest.Server
	hits atomic.Int64
}

func newPod(t *testing.T, h http.HandlerFunc) *pod {
	p := &pod{}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.hits.Add(1)
		h(w, r)
	}))
	t.Cleanup(p.Close)
	return p
}

func hi(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("hi from the pod\n")) }

// raw sends a request as written and reads the response: for what Go's
// client will not send (CONNECT to a non-proxy, absolute-form URIs,
// Connection-named headers).
func raw(t *testing.T, addr, request string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, strings.ReplaceAll(request, "\n", "\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

func TestWaysIn(t *testing.T) {
	e := newEnv(t, 0)
	p := newPod(t, hi)
	e.serve(t, target.Target{Key: hello, Ports: []uint16{80}}, p.Server)
	for _, ns := range []string{"team-a", "team-b"} {
		e.serve(t, target.Target{Key: target.Key{Namespace: ns, Name: "api"}, Hosts: []string{"api.example.com"}}, p.Server)
	}

	tests := []struct {
		name     string
		request  string
		code     int
		reason   string // of sockscale_activator_error_responses_total; "" for none
		body     string // substring
		header   [2]string
		forwards bool
	}{
		{name: "CONNECT", request: "CONNECT example.com:443 HTTP/1.1\nHost: example.com:443\n\n",
			code: 405, reason: reasonConnect, body: "CONNECT is refused", header: [2]string{"Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"}},
		{name: "CONNECT to a target", request: "CONNECT hello.default:80 HTTP/1.1\nHost: hello.default:80\nSockscale-Probe: activator\n\n",
			code: 405, reason: reasonConnect},
		{name: "absolute-form URI naming another host, target by header", request: "GET http://example.com/ HTTP/1.1\nHost: hello.default\nSockscale-Target: default/hello\n\n",
			code: 400, reason: reasonAbsoluteURI, body: `the request URI names host "example.com", which is not target default/hello: the activator is not a forward proxy`},
		{name: "absolute-form URI naming an unknown host", request: "GET http://example.com/ HTTP/1.1\nHost: hello.default\n\n",
			code: 404, reason: reasonUnknownTarget, body: `host "example.com" matches no target`},
		{name: "absolute-form URI naming the target", request: "GET http://hello.default.svc/ HTTP/1.1\nHost: whatever\nSockscale-Target: default/hello\n\n",
			code: 200, body: "hi from the pod", forwards: true},
		{name: "unknown host", request: "GET / HTTP/1.1\nHost: nope.default:80\n\n",
			code: 404, reason: reasonUnknownTarget, body: `host "nope.default:80" matches no target: tried ClusterIPs, Service names`},
		{name: "unknown target header", request: "GET / HTTP/1.1\nHost: hello.default\nSockscale-Target: default/nope\n\n",
			code: 404, reason: reasonUnknownTarget, body: `Sockscale-Target "default/nope" names no target`},
		{name: "malformed target header", request: "GET / HTTP/1.1\nHost: hello.default\nSockscale-Target: hello\n\n",
			code: 400, reason: reasonBadTargetHeader, body: "want <namespace>/<name>"},
		{name: "bare name", request: "GET / HTTP/1.1\nHost: hello\n\n",
			code: 404, reason: reasonUnknownTarget, body: `host "hello" has no namespace: the activator serves every namespace and cannot know the client's, so a name alone never resolves; use hello.<namespace>`},
		{name: "route host of two targets", request: "GET / HTTP/1.1\nHost: api.example.com\n\n",
			code: 404, reason: reasonAmbiguousTarget, body: "route host of targets team-a/api, team-b/api"},
		{name: "port not of the Service", request: "GET / HTTP/1.1\nHost: hello.default:8080\n\n",
			code: 404, reason: reasonUnknownTarget, body: "whose ports are [80], not 8080"},
		{name: "activator probe, any host, never forwarded", request: "GET / HTTP/1.1\nHost: 10.96.0.1:80\nSockscale-Probe: activator\nUser-Agent: sockscale-probe/activator\n\n",
			code: 200, body: "sockscale-activator activator-0", header: [2]string{activatorprobe.ResponseHeader, "activator-0"}},
		{name: "already through an activator", request: "GET / HTTP/1.1\nHost: hello.default:80\nSockscale-Proxied: activator-1\n\n",
			code: 508, reason: reasonLoop, body: `carries Sockscale-Proxied "activator-1": it was already forwarded by a sockscale activator`},
		{name: "already through an activator, empty mark, target by header", request: "GET / HTTP/1.1\nHost: x\nSockscale-Target: default/hello\nSockscale-Proxied:\n\n",
			code: 508, reason: reasonLoop},
		{name: "by name", request: "GET / HTTP/1.1\nHost: hello.default:80\n\n", code: 200, body: "hi from the pod", forwards: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hits := p.hits.Load()
			var before float64
			if tt.reason != "" {
				before = e.errorResponses(t, tt.code, tt.reason)
			}
			resp, body := raw(t, e.addr(), tt.request)
			if resp.StatusCode != tt.code || !strings.Contains(body, tt.body) {
				t.Errorf("got %d %q; want %d with %q", resp.StatusCode, body, tt.code, tt.body)
			}
			if tt.header[0] != "" && resp.Header.Get(tt.header[0]) != tt.header[1] {
				t.Errorf("%s: %q, want %q", tt.header[0], resp.Header.Get(tt.header[0]), tt.header[1])
			}
			if forwarded := p.hits.Load() > hits; forwarded != tt.forwards {
				t.Errorf("forwarded = %v, want %v", forwarded, tt.forwards)
			}
			if tt.reason != "" {
				if got := e.errorResponses(t, tt.code, tt.reason) - before; got != 1 {
					t.Errorf("error_responses_total{code=%d,reason=%s} rose by %v, want 1", tt.code, tt.reason, got)
				}
			}
		})
	}
}

// errorResponses reads sockscale_activator_error_responses_total{code, reason}.
func (e *env) errorResponses(t *testing.T, code int, reason string) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sockscale_activator_error_responses_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["code"] == fmt.Sprint(code) && l["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func TestForwardedHeaders(t *testing.T) {
	e := newEnv(t, 0)
	seen := make(chan *http.Request, 1)
	p := newPod(t, func(w http.ResponseWriter, r *http.Request) {
		seen <- r
		w.Header().Set("Connection", "X-Resp-Hop")
		w.Header().Set("X-Resp-Hop", "hop")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("X-Kept", "kept")
	})
	e.serve(t, target.Target{Key: hello}, p.Server)

	resp, _ := raw(t, e.addr(), `GET /a/b?c=d HTTP/1.1
Host: Hello.Default:80
X-Forwarded-For: 203.0.113.7
X-Forwarded-Proto: https
Connection: keep-alive, X-Hop
X-Hop: secret
Keep-Alive: timeout=5
Proxy-Authorization: Basic c2VjcmV0
Proxy-Connection: keep-alive
Sockscale-Target: default/hello
X-App: app

`)
	r := <-seen
	got := map[string]string{"Host": r.Host, "URI": r.RequestURI}
	for _, k := range []string{"X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host", "X-Hop", "Keep-Alive", "Proxy-Authorization",
		"Proxy-Connection", "Connection", "Sockscale-Target", ProxiedHeader, "X-App"} {
		if v := r.Header.Values(k); len(v) > 0 {
			got[k] = strings.Join(v, " | ")
		}
	}
	want := map[string]string{
		"Host":              "Hello.Default:80",
		"URI":               "/a/b?c=d",
		"X-Forwarded-For":   "203.0.113.7, 127.0.0.1",
		"X-Forwarded-Proto": "https",
		"X-Forwarded-Host":  "Hello.Default:80",
		ProxiedHeader:       "activator-0",
		"X-App":             "app",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("request at the pod (-want +got):\n%s", diff)
	}
	gotResp := map[string]string{}
	for _, k := range []string{"X-Resp-Hop", "Keep-Alive", "X-Kept"} {
		if v := resp.Header.Get(k); v != "" {
			gotResp[k] = v
		}
	}
	if diff := cmp.Diff(map[string]string{"X-Kept": "kept"}, gotResp); diff != "" {
		t.Errorf("response at the client (-want +got):\n%s", diff)
	}
}

// TestProbeAgentsDisarmed: a client's probe User-Agent reaches the pod
// changed, so the pod's agent (which believes that header on an
// activator's connections, for the activator's own prober) counts the
// request as load; any other User-Agent is forwarded as sent.
func TestProbeAgentsDisarmed(t *testing.T) {
	e := newEnv(t, 0)
	seen := make(chan string, 1)
	p := newPod(t, func(w http.ResponseWriter, r *http.Request) {
		seen <- strings.Join(r.Header.Values("User-Agent"), " | ")
	})
	e.serve(t, target.Target{Key: hello}, p.Server)
	for _, tt := range []struct{ sent, want string }{
		{"kube-probe/1.36", disarmedPrefix + "kube-probe/1.36"},
		{"  sockscale-probe/readiness", disarmedPrefix + "sockscale-probe/readiness"},
		{"curl/8.5.0", "curl/8.5.0"},
		{"Kube-Probe/1.36", "Kube-Probe/1.36"}, // not what the kernel matches
	} {
		raw(t, e.addr(), "GET / HTTP/1.1\nHost: hello.default\nUser-Agent: "+tt.sent+"\n\n")
		if got := <-seen; got != tt.want {
			t.Errorf("User-Agent %q reached the pod as %q, want %q", tt.sent, got, tt.want)
		}
	}
}

func TestStreamingFlushesEachWrite(t *testing.T) {
	e := newEnv(t, 0)
	next := make(chan struct{})
	p := newPod(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		<-next // the pod's handler has not ended
		_, _ = io.WriteString(w, "second\n")
	})
	e.serve(t, target.Target{Key: hello}, p.Server)
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL, nil)
	req.Host = "hello.default"
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first line = %q, %v", line, err)
	}
	close(next)
	rest, _ := io.ReadAll(br)
	if string(rest) != "second\n" {
		t.Errorf("rest = %q", rest)
	}
}

func TestTrailers(t *testing.T) {
	e := newEnv(t, 0)
	p := newPod(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Trailer", "X-Checksum")
		_, _ = w.Write(body)
		w.Header().Set("X-Checksum", fmt.Sprint(len(body), r.Trailer.Get("X-Req-Sum")))
		w.Header().Set(http.TrailerPrefix+"X-Unannounced", "late")
	})
	e.serve(t, target.Target{Key: hello}, p.Server)
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL, io.NopCloser(strings.NewReader("payload")))
	req.Host = "hello.default"
	req.ContentLength = -1 // chunked, so the request can carry trailers
	req.Trailer = http.Header{"X-Req-Sum": {"7"}}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	got := map[string]string{"body": string(body), "X-Checksum": resp.Trailer.Get("X-Checksum"), "X-Unannounced": resp.Trailer.Get("X-Unannounced")}
	want := map[string]string{"body": "payload", "X-Checksum": "77", "X-Unannounced": "late"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestWebsocketUpgrade: the upgrade goes through, bytes flow both ways,
// and the connection holds its pod slot until it closes (cc 1: a second
// request waits for it).
func TestWebsocketUpgrade(t *testing.T) {
	e := newEnv(t, 0)
	p := newPod(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			hi(w, r)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = brw.Flush()
		_, _ = io.Copy(c, brw) // echo
	})
	e.serve(t, target.Target{Key: hello, ContainerConcurrency: 1}, p.Server)

	c, err := net.Dial("tcp", e.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: hello.default\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Upgrade") != "websocket" {
		t.Fatalf("upgrade answered %d %v", resp.StatusCode, resp.Header)
	}
	for _, msg := range []string{"ping", "pong and more"} {
		_, _ = io.WriteString(c, msg)
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(br, buf); err != nil || string(buf) != msg {
			t.Fatalf("echo = %q, %v; want %q", buf, err, msg)
		}
	}

	done := make(chan string, 1)
	go func() {
		_, body, err := e.get(t, context.Background(), "hello.default")
		if err != nil {
			body = err.Error()
		}
		done <- body
	}()
	e.waitHeld(t, 1) // the websocket has the pod's only slot
	c.Close()
	if body := <-done; body != "hi from the pod\n" {
		t.Errorf("request after the websocket closed: %q", body)
	}
}

func TestH2C(t *testing.T) {
	h2c := new(http.Protocols)
	h2c.SetUnencryptedHTTP2(true)
	client := &http.Client{Transport: &http.Transport{Protocols: h2c}}
	defer client.CloseIdleConnections()

	e := newEnv(t, 0)
	proto := make(chan int, 1)
	answer := func(w http.ResponseWriter, r *http.Request) { proto <- r.ProtoMajor; hi(w, r) }
	http1Pod := newPod(t, answer)
	e.serve(t, target.Target{Key: hello}, http1Pod.Server)
	grpcKey := target.Key{Namespace: "default", Name: "grpc"}
	h2cPod := &pod{Server: httptest.NewUnstartedServer(http.HandlerFunc(answer))}
	h2cPod.Config.Protocols = h2c
	h2cPod.Start()
	defer h2cPod.Close()
	e.serve(t, target.Target{Key: grpcKey, H2C: true}, h2cPod.Server)

	tests := []struct {
		host          string
		wantPodsProto int
	}{
		{"hello.default", 1}, // h2c in, HTTP/1.1 to a pod that speaks only that
		{"grpc.default", 2},  // h2c all the way
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(http.MethodGet, e.srv.URL, nil)
		req.Host = tt.host
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 || string(body) != "hi from the pod\n" {
			t.Errorf("%s: client got HTTP/%d %q, want HTTP/2", tt.host, resp.ProtoMajor, body)
		}
		if got := <-proto; got != tt.wantPodsProto {
			t.Errorf("%s: pod got HTTP/%d, want HTTP/%d", tt.host, got, tt.wantPodsProto)
		}
	}
}

func TestHeldUntilAPodIsReady(t *testing.T) {
	e := newEnv(t, 0)
	p := newPod(t, hi)
	e.serve(t, target.Target{Key: hello})
	done := make(chan string, 1)
	go func() {
		resp, body, err := e.get(t, context.Background(), "hello.default.svc.cluster.local")
		if err != nil {
			done <- err.Error()
			return
		}
		done <- fmt.Sprint(resp.StatusCode, " ", body)
	}()
	e.waitHeld(t, 1)
	e.setPods(hello, p.Server)
	if got := <-done; got != "200 hi from the pod\n" {
		t.Errorf("held request got %q", got)
	}
}

func TestHoldFailures(t *testing.T) {
	t.Run("queue full: 503 with Retry-After", func(t *testing.T) {
		e := newEnv(t, 1)
		e.serve(t, target.Target{Key: hello})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		held := make(chan error, 1)
		go func() { _, _, err := e.get(t, ctx, "hello.default"); held <- err }()
		e.waitHeld(t, 1)
		resp, body, err := e.get(t, context.Background(), "hello.default")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "2" ||
			body != "sockscale-activator: queue full: default/hello already holds 1 requests, its queue depth; retry later\n" {
			t.Errorf("got %d Retry-After %q %q", resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		cancel()
		<-held
	})
	t.Run("deadline: 504 saying how long and why", func(t *testing.T) {
		e := newEnv(t, 0)
		e.serve(t, target.Target{Key: hello, Timeout: 50 * time.Millisecond})
		resp, body, err := e.get(t, context.Background(), "hello.default")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"deadline passed while held: default/hello: held ", "no pod of the target became ready", "(the target's request timeout is 50ms)"} {
			if resp.StatusCode != 504 || !strings.Contains(body, want) {
				t.Errorf("got %d %q, want 504 saying %q", resp.StatusCode, body, want)
			}
		}
	})
	t.Run("pod slower than the timeout: 504", func(t *testing.T) {
		e := newEnv(t, 0)
		p := newPod(t, func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
		e.serve(t, target.Target{Key: hello, Timeout: 50 * time.Millisecond}, p.Server)
		resp, body, err := e.get(t, context.Background(), "hello.default")
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("sockscale-activator: pod %s of default/hello did not answer within the request timeout of 50ms\n", p.Listener.Addr())
		if resp.StatusCode != 504 || body != want {
			t.Errorf("got %d %q, want 504 %q", resp.StatusCode, body, want)
		}
	})
	t.Run("pod refuses: the request, body included, goes to another pod", func(t *testing.T) {
		e := newEnv(t, 0)
		var got atomic.Value
		live := newPod(t, func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			got.Store(string(b))
			hi(w, r)
		})
		// Both pods of a CC 1 target: the throttle's first pick is either.
		gone := newPod(t, hi)
		e.serve(t, target.Target{Key: hello, ContainerConcurrency: 1}, gone.Server, live.Server)
		gone.Close()
		for i := range 4 {
			req, _ := http.NewRequest(http.MethodPost, e.srv.URL, strings.NewReader(fmt.Sprintf("body %d", i)))
			req.Host = "hello.default"
			resp, err := e.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(body) != "hi from the pod\n" || got.Load() != fmt.Sprintf("body %d", i) {
				t.Errorf("request %d: got %d %q, the pod read %q", i, resp.StatusCode, body, got.Load())
			}
		}
	})
	t.Run("pod fails after the request was sent: 502 naming it, not retried", func(t *testing.T) {
		e := newEnv(t, 0)
		var calls atomic.Int32
		p := newPod(t, func(w http.ResponseWriter, _ *http.Request) {
			calls.Add(1)
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close() // the request arrived; no answer
			}
		})
		e.serve(t, target.Target{Key: hello}, p.Server)
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL, strings.NewReader("once"))
		req.Host = "hello.default"
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		want := fmt.Sprintf("sockscale-activator: forward to pod %s of default/hello: ", p.Listener.Addr())
		if resp.StatusCode != 502 || !strings.HasPrefix(string(body), want) {
			t.Errorf("got %d %q, want 502 %q...", resp.StatusCode, body, want)
		}
		if n := calls.Load(); n != 1 {
			t.Errorf("the pod got the request %d times, want once", n)
		}
	})
	t.Run("pod closes the connection without an answer to a GET: it goes to another pod", func(t *testing.T) {
		// As a leaving pod's drain closes a kept-alive connection the
		// moment a request goes out on it.
		e := newEnv(t, 0)
		var closed atomic.Int32
		closing := newPod(t, func(w http.ResponseWriter, _ *http.Request) {
			closed.Add(1)
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				conn.Close()
			}
		})
		live := newPod(t, hi)
		e.serve(t, target.Target{Key: hello, ContainerConcurrency: 1}, closing.Server, live.Server)
		for i := range 4 {
			resp, body, err := e.get(t, context.Background(), "hello.default")
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 200 || body != "hi from the pod\n" {
				t.Errorf("request %d: got %d %q, want 200 from the live pod", i, resp.StatusCode, body)
			}
		}
		if closed.Load() == 0 {
			t.Error("the closing pod got no request: the case was not exercised")
		}
	})
	t.Run("every pod unreachable (dial timeout): 502 after three, not the request timeout", func(t *testing.T) {
		// A dial timeout matches context.DeadlineExceeded too; it must not
		// read as the target's request timeout (5 minutes that did not pass).
		tr := NewTransport()
		tr.DialContext = (&net.Dialer{Timeout: time.Nanosecond}).DialContext
		table := resolve.NewTable("")
		reg := prometheus.NewRegistry()
		th := throttle.New(throttle.Options{Self: "activator-0"})
		srv := httptest.NewServer(New(Options{PodName: "activator-0", Resolver: table, Throttler: th, Stats: &countingStats{}, Transport: tr, Registerer: reg}))
		defer srv.Close()
		if err := table.Upsert(target.Target{Key: hello}); err != nil {
			t.Fatal(err)
		}
		if err := th.Update(hello, throttle.Settings{}); err != nil {
			t.Fatal(err)
		}
		// TEST-NET-1: never dialled, the dial times out at once.
		var pods []netip.AddrPort
		for i := 1; i <= 4; i++ {
			pods = append(pods, netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), 8080))
		}
		th.SetPods(hello, pods)
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Host = "hello.default"
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		for _, want := range []string{"sockscale-activator: default/hello: 3 pods in a row could not be reached, the last 192.0.2.", ": pod unreachable: dial tcp 192.0.2.", ": i/o timeout\n"} {
			if resp.StatusCode != 502 || !strings.Contains(string(body), want) {
				t.Errorf("got %d %q, want 502 saying %q", resp.StatusCode, body, want)
			}
		}
		if got := (&env{reg: reg}).errorResponses(t, 502, reasonPodUnreachable); got != 1 {
			t.Errorf("502 pod_unreachable responses = %v, want 1", got)
		}
	})
	t.Run("shutdown: held requests get 503 and Connection: close", func(t *testing.T) {
		e := newEnv(t, 0)
		e.serve(t, target.Target{Key: hello})
		type result struct {
			resp *http.Response
			body string
			err  error
		}
		done := make(chan result, 1)
		go func() { r, b, err := e.get(t, context.Background(), "hello.default"); done <- result{r, b, err} }()
		e.waitHeld(t, 1)
		e.stop(ErrShuttingDown)
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		want := "sockscale-activator: activator shutting down: the request was held and not forwarded; retry\n"
		if r.resp.StatusCode != 503 || r.body != want || !r.resp.Close {
			t.Errorf("got %d %q close=%v; want 503 %q and the connection closed", r.resp.StatusCode, r.body, r.resp.Close, want)
		}
	})
}

// TestClientGoneFreesItsPlace: a client that leaves while held frees its
// place in the queue at once, and many such leave no goroutine behind.
func TestClientGoneFreesItsPlace(t *testing.T) {
	e := newEnv(t, 0)
	e.serve(t, target.Target{Key: hello})
	// One connection per request, so every one is a client that hangs up.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	before := runtime.NumGoroutine()

	const n = 200
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.srv.URL, nil)
			req.Host = "hello.default"
			if _, err := client.Do(req); !errors.Is(err, context.Canceled) {
				t.Errorf("held request: %v, want canceled", err)
			}
		})
	}
	e.waitHeld(t, n)
	cancel()
	wg.Wait()
	e.waitHeld(t, 0)
	client.CloseIdleConnections()
	waitFor(t, "goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
	waitFor(t, "every request to end", func() bool { return e.stats.begun.Load() == e.stats.ended.Load() })
	if got := e.stats.begun.Load(); got != n {
		t.Errorf("%d requests counted, want %d", got, n)
	}
}

// TestDrain follows a SIGTERM with drain delay 200 ms and grace 1 s: a
// request already at a pod finishes, one arriving during the delay is
// served, readiness fails at once, and a request still held near the end
// of grace gets a 503 saying why.
func TestDrain(t *testing.T) {
	e := newEnv(t, 0)
	health := &Health{}
	world := target.Key{Namespace: "default", Name: "world"}
	fast := target.Key{Namespace: "default", Name: "fast"}
	release := make(chan struct{})
	atPod := make(chan struct{}, 1)
	slow := newPod(t, func(w http.ResponseWriter, r *http.Request) { atPod <- struct{}{}; <-release; hi(w, r) })
	e.serve(t, target.Target{Key: hello}, slow.Server)
	e.serve(t, target.Target{Key: world}) // no pod: held
	e.serve(t, target.Target{Key: fast}, newPod(t, hi).Server)

	type result struct {
		code  int
		body  string
		close bool
	}
	request := func(host string) chan result {
		c := make(chan result, 1)
		go func() {
			resp, body, err := e.get(t, context.Background(), host)
			if err != nil {
				c <- result{body: err.Error()}
				return
			}
			c <- result{resp.StatusCode, body, resp.Close}
		}()
		return c
	}
	forwarded := request("hello.default")
	<-atPod
	held := request("world.default")
	waitFor(t, "world's request held", func() bool { return e.th.Held(world) == 1 })

	drained := make(chan struct{})
	start := time.Now()
	go func() {
		Drain([]*http.Server{e.srv.Config}, health, e.stop, 200*time.Millisecond, time.Second, slog.New(slog.DiscardHandler))
		close(drained)
	}()
	waitFor(t, "readiness to fail", func() bool {
		rec := httptest.NewRecorder()
		health.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code == http.StatusServiceUnavailable
	})
	if got := <-request("fast.default"); got.code != 200 {
		t.Errorf("request during the drain delay: %+v, want 200", got)
	}
	close(release)
	if got := <-forwarded; got.code != 200 || got.body != "hi from the pod\n" {
		t.Errorf("request at a pod when draining began: %+v, want 200", got)
	}
	want := result{503, "sockscale-activator: activator shutting down: the request was held and not forwarded; retry\n", true}
	if diff := cmp.Diff(want, <-held, cmp.AllowUnexported(result{})); diff != "" {
		t.Errorf("held request (-want +got):\n%s", diff)
	}
	select {
	case <-drained:
	case <-time.After(10 * time.Second):
		t.Fatal("Drain did not return")
	}
	if d := time.Since(start); d < 900*time.Millisecond {
		t.Errorf("Drain returned after %v: the held request should have had until the last tenth of grace", d)
	}
	if _, err := net.Dial("tcp", e.addr()); err == nil {
		t.Error("still accepting connections after Drain")
	}
}

// A pod's response to a request held while its target had no ready pod
// says so, with the seconds it was held; one served at once does not, nor
// does any of a target that opted out.
func TestColdStartHeader(t *testing.T) {
	for _, optIn := range []bool{true, false} {
		e := newEnv(t, 0)
		p := newPod(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(v1alpha1.ColdStartHeader, "forged by the pod")
			hi(w, r)
		})
		e.serve(t, target.Target{Key: hello, ColdStartHeader: optIn})
		type answer struct {
			resp *http.Response
			err  error
		}
		held := make(chan answer, 1)
		go func() {
			resp, _, err := e.get(t, context.Background(), "hello.default")
			held <- answer{resp, err}
		}()
		e.waitHeld(t, 1)
		time.Sleep(200 * time.Millisecond)
		e.setPods(hello, p.Server)
		a := <-held
		if a.err != nil {
			t.Fatal(a.err)
		}
		got := a.resp.Header.Values(v1alpha1.ColdStartHeader)
		if optIn {
			secs, err := strconv.ParseFloat(strings.Join(got, ""), 64)
			if len(got) != 1 || err != nil || secs < 0.2 || secs > 5 {
				t.Errorf("held through a cold start: %s %q, want one value, the seconds held (0.2 or a little more)", v1alpha1.ColdStartHeader, got)
			}
		} else if len(got) != 1 || got[0] != "forged by the pod" {
			t.Errorf("opted out: %s %q, want the pod's own header only", v1alpha1.ColdStartHeader, got)
		}
		resp, _, err := e.get(t, context.Background(), "hello.default")
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.Header.Values(v1alpha1.ColdStartHeader); len(got) != 1 || got[0] != "forged by the pod" {
			t.Errorf("served at once (opted in %v): %s %q, want the pod's own header only", optIn, v1alpha1.ColdStartHeader, got)
		}
	}
}

// A target's health checks are answered by the activator while it has no
// ready pod, with its status, not held, not counted, not waking it; other
// requests (another path, user agent or method) are held as ever; once a
// pod is ready, health checks go to it.
func TestHealthChecksAtZero(t *testing.T) {
	e := newEnv(t, 0)
	p := newPod(t, hi)
	checks := &target.HealthChecks{Paths: []string{"/healthz", "/"}, UserAgents: []string{"ELB-HealthChecker", "UptimeRobot"}, Status: http.StatusNoContent}
	e.serve(t, target.Target{Key: hello, HealthChecks: checks})
	send := func(ctx context.Context, method, path, ua string) (*http.Response, string, error) {
		req, err := http.NewRequestWithContext(ctx, method, e.srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = "hello.default"
		req.Header.Set("User-Agent", ua)
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp, string(body), err
	}
	for _, c := range []struct{ method, path, ua string }{
		{http.MethodGet, "/healthz", "ELB-HealthChecker/2.0"},
		{http.MethodHead, "/healthz?full=1", "ELB-HealthChecker/2.0"},
		{http.MethodGet, "/", "Mozilla/5.0+(compatible; UptimeRobot/2.0; http://www.uptimerobot.com/)"},
	} {
		resp, body, err := send(context.Background(), c.method, c.path, c.ua)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusNoContent || resp.Header.Get(HealthCheckHeader) != "activator-0" {
			t.Errorf("%s %s by %q at zero: %d %s=%q %q, want 204 from the activator", c.method, c.path, c.ua, resp.StatusCode, HealthCheckHeader, resp.Header.Get(HealthCheckHeader), body)
		}
	}
	if b := e.stats.begun.Load(); b != 0 {
		t.Errorf("%d health checks counted as requests, want none", b)
	}
	if got := counter(t, e.reg, "sockscale_activator_health_checks_answered_total", map[string]string{"namespace": "default"}); got != 3 {
		t.Errorf("health_checks_answered_total = %v, want 3", got)
	}
	// Not health checks: held for a pod like any request.
	for _, c := range []struct{ method, path, ua string }{
		{http.MethodPost, "/healthz", "ELB-HealthChecker/2.0"},
		{http.MethodGet, "/healthz", "curl/8.0"},
		{http.MethodGet, "/healthz/deep", "ELB-HealthChecker/2.0"},
	} {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _, _, _ = send(ctx, c.method, c.path, c.ua); close(done) }()
		e.waitHeld(t, 1)
		cancel()
		<-done
		waitFor(t, "the held request to leave", func() bool { return e.th.Held(hello) == 0 })
	}
	// A ready pod answers them.
	e.setPods(hello, p.Server)
	resp, body, err := send(context.Background(), http.MethodGet, "/healthz", "ELB-HealthChecker/2.0")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || body != "hi from the pod\n" || resp.Header.Get(HealthCheckHeader) != "" {
		t.Errorf("health check with a ready pod: %d %q, want the pod's answer", resp.StatusCode, body)
	}
}

// TestForwardsToAnIPv6Pod: a pod known by its IPv6 address (an IPv6-only
// pod) is forwarded to as "[address]:port", and its reply comes back.
func TestForwardsToAnIPv6Pod(t *testing.T) {
	l, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback to listen on: %v", err)
	}
	var host atomic.Value
	p := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host.Store(r.Host)
		_, _ = w.Write([]byte("hi from the IPv6 pod\n"))
	}))
	p.Listener = l
	p.Start()
	t.Cleanup(p.Close)
	if !netip.MustParseAddrPort(l.Addr().String()).Addr().Is6() {
		t.Fatalf("the pod listens on %s, want an IPv6 address", l.Addr())
	}
	e := newEnv(t, 0)
	e.serve(t, target.Target{Key: hello, Ports: []uint16{80}}, p)
	resp, body, err := e.get(t, t.Context(), "hello.default")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || body != "hi from the IPv6 pod\n" {
		t.Errorf("status %d, body %q; want 200 from the IPv6 pod", resp.StatusCode, body)
	}
	if got, _ := host.Load().(string); got != "hello.default" {
		t.Errorf("the pod saw Host %q, want the client's hello.default", got)
	}
}
