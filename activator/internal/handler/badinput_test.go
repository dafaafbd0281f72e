package handler

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sockscale/sockscale/activator/internal/target"
	"github.com/sockscale/sockscale/internal/serve"
	"github.com/sockscale/sockscale/internal/testutil/badclient"
)

// The proxy port meets bad input with net/http's 4xx answers before the
// handler: oversized headers 431, malformed requests 400; slow headers
// (slowloris) do not keep a well-formed client waiting; and a target
// whose queue is flooded does not hold up another target.
func TestProxyBadInput(t *testing.T) {
	e := newEnv(t, 5)
	if e.srv.Config.ReadHeaderTimeout != serve.ReadHeaderTimeout || e.srv.Config.MaxHeaderBytes != serve.MaxHeaderBytes || e.srv.Config.IdleTimeout == 0 {
		t.Fatalf("proxy server limits: header timeout %v, max header bytes %d, idle %v", e.srv.Config.ReadHeaderTimeout, e.srv.Config.MaxHeaderBytes, e.srv.Config.IdleTimeout)
	}
	e.serve(t, target.Target{Key: hello}, newPod(t, hi).Server)
	good := "GET / HTTP/1.1\r\nHost: hello.default\r\n\r\n"

	for _, tt := range []struct {
		name, raw string
		truncated bool // the client closes its side after raw
		code      int
		say       string
	}{
		{"well-formed", good, false, 200, "hi from the pod"},
		{"a 32 KiB header is forwarded", strings.Replace(badclient.OversizedHeader(32<<10), "Host: x", "Host: hello.default", 1), false, 200, "hi from the pod"},
		{"a 128 KiB header", badclient.OversizedHeader(128 << 10), false, 431, "Request Header Fields Too Large"},
		// At least the 24 bytes of HTTP/2's preface, which the server
		// compares the first bytes against (h2c with prior knowledge).
		{"garbage request line", "NOT A REQUEST, ONLY BYTES\r\n\r\n", false, 400, "Bad Request"},
		{"HTTP/1.1 without Host", "GET / HTTP/1.1\r\n\r\n", false, 400, "missing required Host header"},
		{"truncated headers", "GET / HTTP/1.1\r\nHost: hello.default\r\nX-Half", true, 400, "Bad Request"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			send := badclient.Raw
			if tt.truncated {
				send = badclient.Truncated
			}
			code, body := send(t, e.addr(), tt.raw)
			if code != tt.code || !strings.Contains(body, tt.say) {
				t.Errorf("answer %d %q, want %d saying %q", code, body, tt.code, tt.say)
			}
		})
	}

	t.Run("slow headers", func(t *testing.T) {
		badclient.SlowHeaders(t, e.addr(), 200)
		start := time.Now()
		code, body := badclient.Raw(t, e.addr(), good)
		if code != 200 || !strings.Contains(body, "hi from the pod") || time.Since(start) > time.Second {
			t.Errorf("well-formed client beside 200 slow ones: %d %q after %v, want 200 at once", code, body, time.Since(start))
		}
	})

	t.Run("a flooded target", func(t *testing.T) {
		cold := target.Key{Namespace: "default", Name: "cold"}
		e.serve(t, target.Target{Key: cold}) // no pods: requests are held
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		for range 5 {
			wg.Go(func() { _, _, _ = e.get(t, ctx, "cold.default") })
		}
		waitFor(t, "5 held for cold", func() bool { return e.th.Held(cold) == 5 })
		resp, body, err := e.get(t, context.Background(), "cold.default")
		if err != nil || resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "queue full") {
			t.Errorf("sixth request to the flooded target: %v %v %q, want 503 queue full", resp, err, body)
		}
		start := time.Now()
		resp, body, err = e.get(t, context.Background(), "hello.default")
		if err != nil || resp.StatusCode != 200 || body != "hi from the pod\n" || time.Since(start) > time.Second {
			t.Errorf("another target beside the flood: %v %v %q after %v, want 200 at once", resp, err, body, time.Since(start))
		}
	})
}
