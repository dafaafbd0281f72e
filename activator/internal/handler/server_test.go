package handler

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestReadyzWaitsForReady: /readyz fails, saying why, until Ready is
// satisfied (the activator's targets are synced), and fails again on drain.
func TestReadyzWaitsForReady(t *testing.T) {
	why := errors.New("targets not synced yet")
	health := &Health{Ready: func() error { return why }}
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		health.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get(); code != http.StatusServiceUnavailable || !strings.Contains(body, "targets not synced yet") {
		t.Errorf("before ready: %d %q, want 503 naming why", code, body)
	}
	why = nil
	if code, _ := get(); code != http.StatusOK {
		t.Errorf("ready: %d, want 200", code)
	}
	health.Drain()
	if code, body := get(); code != http.StatusServiceUnavailable || !strings.Contains(body, "draining") {
		t.Errorf("draining: %d %q, want 503 saying draining", code, body)
	}
}

// An h2c request held without its body read pins at most the stream's
// window in the activator, not Go's default megabyte: the client can
// send no more until the body is read.
func TestH2CBodyBufferedPerStreamIsBounded(t *testing.T) {
	release := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release // held: the body is not read
	})
	srv := httptest.NewUnstartedServer(h)
	srv.Config = NewServer("", h, context.Background())
	srv.Start()
	defer srv.Close()
	defer close(release)

	h2c := new(http.Protocols)
	h2c.SetUnencryptedHTTP2(true)
	client := &http.Client{Transport: &http.Transport{Protocols: h2c}}
	defer client.CloseIdleConnections()
	body := &countingReader{left: 4 << 20}
	req, err := http.NewRequest(http.MethodPost, srv.URL, body)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = client.Do(req) }()
	// The client sends what the window allows, then waits: wait for the
	// count to stop growing.
	var last int64 = -1
	for stable := 0; stable < 20; {
		time.Sleep(10 * time.Millisecond)
		if n := body.sent.Load(); n == last && n > 0 {
			stable++
		} else {
			last, stable = n, 0
		}
	}
	// The transport reads one Read ahead of what it may send.
	if limit := int64(MaxReceiveBufferPerStream + 1<<10); last > limit {
		t.Fatalf("client sent %d bytes of a held request's body, want at most %d (a %d-byte stream window and a read)", last, limit, MaxReceiveBufferPerStream)
	}
}

// countingReader yields left zero bytes, counting what was read, a
// kilobyte at a time: the transport then reads no further ahead of what
// the server's window lets it send.
type countingReader struct {
	left int64
	sent atomic.Int64
}

func (r *countingReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), r.left, 1<<10))
	clear(p[:n])
	r.left -= int64(n)
	r.sent.Add(int64(n))
	return n, nil
}
