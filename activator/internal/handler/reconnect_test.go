package handler

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockscale/sockscale/activator/internal/resolve"
	"github.com/sockscale/sockscale/activator/internal/target"
)

// newReconnectEnv is an activator whose handler asks kept-alive clients
// of targets in Serve mode (as its table says) to reconnect, after
// (ReconnectAfter).
func newReconnectEnv(t *testing.T, after time.Duration) *env {
	t.Helper()
	return newEnvWithOptions(t, 0, func(o *Options) {
		o.Modes, o.ReconnectAfter = o.Resolver.(*resolve.Table), after
	})
}

// setMode puts hello in Proxy mode, Serve mode, or neither, keeping its
// pods (the throttle's).
func (e *env) setMode(t *testing.T, proxy, serve bool) {
	t.Helper()
	if err := e.table.Upsert(target.Target{Key: hello, Proxy: proxy, Serve: serve}); err != nil {
		t.Fatal(err)
	}
}

// countingClient is a keep-alive HTTP/1.1 client (h2c with h2c set) that
// counts the connections it opens.
func countingClient(t *testing.T, h2c bool) (*http.Client, *atomic.Int64) {
	t.Helper()
	var dials atomic.Int64
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	if h2c {
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}, &dials
}

// do sends GET / for hello and reads the whole answer (so the connection
// can be reused).
func (e *env) do(t *testing.T, c *http.Client, edit ...func(*http.Request)) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.srv.URL+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "hello.default"
	for _, f := range edit {
		f(req)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// reconnects reads sockscale_activator_reconnects_asked_total{namespace}.
func reconnects(t *testing.T, reg *prometheus.Registry, namespace string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sockscale_activator_reconnects_asked_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "namespace" && lp.GetValue() == namespace {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestReconnectServedClients: a keep-alive client that reached the
// activator while its target was in Proxy mode keeps its connection
// while the target stays there; once the target is in Serve mode, its
// next request is answered by the pod as before, with Connection: close,
// and the client connects again. Neither mode (no ServerlessService of
// its own, not Ready) asks nothing.
func TestReconnectServedClients(t *testing.T) {
	e := newReconnectEnv(t, 0)
	p := newPod(t, hi)
	e.serve(t, target.Target{Key: hello, Proxy: true}, p.Server)
	c, dials := countingClient(t, false)

	answer := func(what string, wantClose bool) {
		t.Helper()
		resp, body := e.do(t, c)
		if resp.StatusCode != http.StatusOK || body != "hi from the pod\n" {
			t.Errorf("%s: %d %q, want 200 from the pod", what, resp.StatusCode, body)
		}
		if resp.Close != wantClose {
			t.Errorf("%s: Connection: close %v, want %v (header %q)", what, resp.Close, wantClose, resp.Header.Values("Connection"))
		}
	}
	for range 3 {
		answer("proxy", false)
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d connections in Proxy mode, want 1", n)
	}
	e.setMode(t, false, false)
	answer("neither mode", false)
	if got := reconnects(t, e.reg, "default"); got != 0 {
		t.Errorf("reconnects_asked_total = %v before Serve mode, want 0", got)
	}

	e.setMode(t, false, true)
	answer("serve", true)
	if got := reconnects(t, e.reg, "default"); got != 1 {
		t.Errorf("reconnects_asked_total{namespace=default} = %v, want 1", got)
	}
	// The client connects again (here the activator is all there is, so
	// it is asked again).
	answer("serve, reconnected", true)
	if n := dials.Load(); n != 2 {
		t.Errorf("%d connections after Serve mode, want 2", n)
	}
	e.setMode(t, true, false)
	answer("back to proxy", false)
	answer("still proxy", false)
	if n := dials.Load(); n != 3 {
		t.Errorf("%d connections, want 3 (one more after the last close, kept in Proxy mode)", n)
	}
	if got, hits := reconnects(t, e.reg, "default"), p.hits.Load(); got != 2 || hits != 8 {
		t.Errorf("reconnects_asked_total = %v, pod hits %d; want 2 and 8", got, hits)
	}
}

// fakeModes says a target has been in Serve mode since since, if serving.
type fakeModes struct {
	mu      sync.Mutex
	since   time.Time
	serving bool
}

func (m *fakeModes) set(since time.Time, serving bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.since, m.serving = since, serving
}

func (m *fakeModes) ServeSince(target.Key) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.since, m.serving
}

// TestReconnectAfterServeSettles: a target only just in Serve mode keeps
// its clients until it has been there ReconnectAfter.
func TestReconnectAfterServeSettles(t *testing.T) {
	modes := &fakeModes{}
	e := newEnvWithOptions(t, 0, func(o *Options) { o.Modes, o.ReconnectAfter = modes, time.Minute })
	e.serve(t, target.Target{Key: hello}, newPod(t, hi).Server)
	c, _ := countingClient(t, false)
	for _, tc := range []struct {
		name      string
		since     time.Duration // before now
		serving   bool
		wantClose bool
	}{
		{"not serving", time.Hour, false, false},
		{"serving for a second", time.Second, true, false},
		{"serving for 59s", 59 * time.Second, true, false},
		{"serving for an hour", time.Hour, true, true},
	} {
		modes.set(time.Now().Add(-tc.since), tc.serving)
		if resp, _ := e.do(t, c); resp.StatusCode != http.StatusOK || resp.Close != tc.wantClose {
			t.Errorf("%s: %d, Connection: close %v; want 200, %v", tc.name, resp.StatusCode, resp.Close, tc.wantClose)
		}
	}
}

// TestReconnectH2CGoesAway: h2c clients of a target in Serve mode are
// told GOAWAY on a pod's response: sixteen streams at a time on one
// client, every request answered by the pod, none failed (a stream opened
// as a GOAWAY is on its way is refused unprocessed and sent again on a new
// connection), and the client connects again.
func TestReconnectH2CGoesAway(t *testing.T) {
	e := newReconnectEnv(t, 0)
	e.serve(t, target.Target{Key: hello, Serve: true}, newPod(t, hi).Server)
	c, dials := countingClient(t, true)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 16 {
		wg.Go(func() {
			for range 10 {
				req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/", nil)
				req.Host = "hello.default"
				resp, err := c.Do(req)
				if err != nil {
					failed.Add(1)
					t.Errorf("h2c request: %v", err)
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusOK || string(body) != "hi from the pod\n" {
					t.Errorf("h2c request: HTTP/%d %d %q; want HTTP/2 200 from the pod", resp.ProtoMajor, resp.StatusCode, body)
				}
			}
		})
	}
	wg.Wait()
	if n := dials.Load(); n < 2 {
		t.Errorf("%d h2c connections for 160 requests, want more than one (each told GOAWAY)", n)
	}
	if got := reconnects(t, e.reg, "default"); got < 1 {
		t.Errorf("reconnects_asked_total = %v, want some", got)
	}
	t.Logf("160 h2c requests, 16 at a time, on %d connections; %v responses asked the client to reconnect", dials.Load(), reconnects(t, e.reg, "default"))
}

// TestReconnectLeavesUpgradesAlone: a websocket to a target in Serve mode
// is switched and carried as before; its 101 keeps Connection: Upgrade.
func TestReconnectLeavesUpgradesAlone(t *testing.T) {
	e := newReconnectEnv(t, 0)
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
	e.serve(t, target.Target{Key: hello, Serve: true}, p.Server)

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
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Upgrade") != "websocket" || !strings.EqualFold(resp.Header.Get("Connection"), "upgrade") {
		t.Fatalf("upgrade answered %d %v", resp.StatusCode, resp.Header)
	}
	msg := "still here"
	_, _ = io.WriteString(c, msg)
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo = %q, %v; want %q", buf, err, msg)
	}
	if got := reconnects(t, e.reg, "default"); got != 0 {
		t.Errorf("reconnects_asked_total = %v, want 0", got)
	}
	c.Close()
	waitFor(t, "the websocket to end", func() bool { return e.stats.ended.Load() == e.stats.begun.Load() })
}

// TestReconnectOnlyOnPodAnswers: the activator's own answers (here a 504:
// no pod in the target's timeout) ask nothing, nor does a request whose
// client closes anyway; a pod's error answer does ask.
func TestReconnectOnlyOnPodAnswers(t *testing.T) {
	e := newReconnectEnv(t, 0)
	e.serve(t, target.Target{Key: hello, Serve: true, Timeout: 100 * time.Millisecond}) // no pod
	c, _ := countingClient(t, false)
	if resp, _ := e.do(t, c); resp.StatusCode != http.StatusGatewayTimeout || resp.Close {
		t.Errorf("no pod: %d, Connection: close %v; want 504, kept", resp.StatusCode, resp.Close)
	}

	p := newPod(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("fail") {
			http.Error(w, "pod failed", http.StatusInternalServerError)
			return
		}
		hi(w, r)
	})
	e.setPods(hello, p.Server)
	resp, body := e.do(t, c, func(r *http.Request) { r.Close = true })
	if resp.StatusCode != http.StatusOK || body != "hi from the pod\n" {
		t.Errorf("client closing: %d %q, want 200 from the pod", resp.StatusCode, body)
	}
	if got := reconnects(t, e.reg, "default"); got != 0 {
		t.Errorf("reconnects_asked_total = %v after a 504 and a client that closes, want 0", got)
	}
	resp, _ = e.do(t, c, func(r *http.Request) { r.URL.RawQuery = "fail" })
	if resp.StatusCode != http.StatusInternalServerError || !resp.Close {
		t.Errorf("pod's 500: %d, Connection: close %v; want 500, close", resp.StatusCode, resp.Close)
	}
}

func TestReconnectable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		major int
		close bool
		hdr   http.Header
		want  bool
	}{
		{"HTTP/1.1 keep-alive", 1, false, nil, true},
		{"HTTP/1.1 closing", 1, true, nil, false},
		{"HTTP/2", 2, false, nil, true},
		{"websocket", 1, false, http.Header{"Connection": {"keep-alive, Upgrade"}, "Upgrade": {"websocket"}}, false},
		{"Connection upgrade alone", 1, false, http.Header{"Connection": {"UPGRADE"}}, false},
		{"Upgrade alone", 1, false, http.Header{"Upgrade": {"h2c"}}, false},
		{"other Connection tokens", 1, false, http.Header{"Connection": {"keep-alive, x-upgraded"}}, true},
	} {
		r := &http.Request{ProtoMajor: tc.major, Close: tc.close, Header: tc.hdr}
		if got := reconnectable(r); got != tc.want {
			t.Errorf("%s: reconnectable = %v, want %v", tc.name, got, tc.want)
		}
	}
}
