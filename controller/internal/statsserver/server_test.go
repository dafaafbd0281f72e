package statsserver

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sockscale/sockscale/internal/stats"
)

// TestServerServesThePathUntilCancelled: a batch POSTed to stats.Path
// reaches the handler; Start returns nil when its context ends.
func TestServerServesThePathUntilCancelled(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	got := make(chan *stats.Batch, 1)
	s := &Server{Addr: addr, Handler: Handler(Options{Accept: func(b *stats.Batch) error { got <- b; return nil }})}
	if s.NeedLeaderElection() {
		t.Error("the stats server waits for leadership; every replica should take stats")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()

	body, _ := stats.Append(nil, batchOf(2))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := http.Post("http://"+addr+stats.Path, stats.ContentType, bytes.NewReader(body))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent {
				t.Fatalf("POST %s: %d, want 204", stats.Path, resp.StatusCode)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server never listened: %v", err)
		}
	}
	if b := <-got; len(b.Pods) != 2 {
		t.Errorf("the handler got %d pods, want 2", len(b.Pods))
	}
	// Headers past MaxHeaderBytes are refused before the handler runs.
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+stats.Path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+strings.Repeat("x", 2*MaxHeaderBytes))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a %d-byte header: %s, want 431", 2*MaxHeaderBytes, resp.Status)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Start: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Start did not return after its context ended")
	}
}

// TestServerTakesBothFamilies: at the chart's bind address (":<port>",
// every address) the stats server takes batches over IPv4 and over IPv6,
// so agents reach it whatever family the cluster gives its stats
// Service.
func TestServerTakesBothFamilies(t *testing.T) {
	l, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	l.Close()
	got := make(chan *stats.Batch, 2)
	s := &Server{Addr: ":" + port, Handler: Handler(Options{Accept: func(b *stats.Batch) error { got <- b; return nil }})}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = s.Start(ctx) }()
	body, _ := stats.Append(nil, batchOf(1))
	for _, host := range []string{"127.0.0.1", "[::1]"} {
		url := "http://" + host + ":" + port + stats.Path
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			resp, err := http.Post(url, stats.ContentType, bytes.NewReader(body))
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode != http.StatusNoContent {
					t.Fatalf("POST %s: %d, want 204", url, resp.StatusCode)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("POST %s: %v", url, err)
			}
		}
		<-got
	}
}
