package serve_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sockscale/sockscale/internal/serve"
	"github.com/sockscale/sockscale/internal/testutil/badclient"
)

// start serves srv on a loopback port until the test ends.
func start(t *testing.T, srv *http.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve.On(ctx, ln, srv) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return ln.Addr().String()
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })

// Bad requests get net/http's 4xx answers (a request cut off in its
// headers too) and never reach the handler.
func TestBadRequests(t *testing.T) {
	addr := start(t, serve.New("", ok))
	for _, tt := range []struct {
		name, raw string
		code      int
		say       string // in the body
	}{
		{"well-formed", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 200, "ok"},
		{"a 32 KiB header is fine", badclient.OversizedHeader(32 << 10), 200, "ok"},
		{"a 128 KiB header", badclient.OversizedHeader(128 << 10), 431, "Request Header Fields Too Large"},
		{"a 2 MiB header", badclient.OversizedHeader(2 << 20), 431, "Request Header Fields Too Large"},
		{"garbage request line", "HELLO\r\n\r\n", 400, "Bad Request"},
		{"header without a colon", "GET / HTTP/1.1\r\nHost: x\r\nno colon\r\n\r\n", 400, "Bad Request"},
		{"HTTP/1.1 without Host", "GET / HTTP/1.1\r\n\r\n", 400, "missing required Host header"},
		{"unsupported protocol version", "GET / HTTP/7.0\r\nHost: x\r\n\r\n", 505, "HTTP Version Not Supported"},
		{"truncated headers", "GET / HTTP/1.1\r\nHost: x\r\nX-Half", 400, "Bad Request"}, // Truncated below
		{"truncated body, shorter than its length", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nshort", 200, "ok"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			send := badclient.Raw
			if strings.HasPrefix(tt.name, "truncated") {
				send = badclient.Truncated
			}
			code, body := send(t, addr, tt.raw)
			if code != tt.code || !strings.Contains(body, tt.say) {
				t.Errorf("answer %d %q, want %d saying %q", code, body, tt.code, tt.say)
			}
		})
	}
}

// A crowd of connections that never finish their headers (slowloris)
// neither blocks a well-formed client nor stays: each is closed once
// ReadHeaderTimeout passes.
func TestSlowHeadersDoNotStarve(t *testing.T) {
	srv := serve.New("", ok)
	if srv.ReadHeaderTimeout != serve.ReadHeaderTimeout || srv.MaxHeaderBytes != serve.MaxHeaderBytes || srv.IdleTimeout == 0 || srv.ReadTimeout == 0 || srv.WriteTimeout == 0 {
		t.Fatalf("server limits %+v", srv)
	}
	srv.ReadHeaderTimeout = 500 * time.Millisecond // the test's pace; New's is 10 s
	addr := start(t, srv)
	slow := badclient.SlowHeaders(t, addr, 200)
	start := time.Now()
	code, body := badclient.Raw(t, addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if code != 200 || body != "ok\n" || time.Since(start) > 400*time.Millisecond {
		t.Errorf("well-formed client beside 200 slow ones: %d %q after %v, want 200 at once", code, body, time.Since(start))
	}
	for i, c := range slow {
		if !badclient.ClosedWithin(c, 3*time.Second) {
			t.Fatalf("slow connection %d still open 3 s after a 500 ms header timeout", i)
		}
	}
}
