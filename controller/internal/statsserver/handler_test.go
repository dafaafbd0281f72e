package statsserver

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sockscale/sockscale/internal/stats"
)

func batchOf(n int) *stats.Batch {
	b := &stats.Batch{Node: "node-a", Start: time.Unix(1700000000, 123456789), Period: time.Second}
	for i := range n {
		b.Pods = append(b.Pods, stats.PodStat{
			IP: netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}), Namespace: "default", Pod: fmt.Sprintf("hello-%d", i), Workload: "hello",
			Concurrency: float64(i), Requests: uint64(i * 10),
		})
	}
	return b
}

func TestHandler(t *testing.T) {
	var got []*stats.Batch
	srv := httptest.NewServer(Handler(Options{Accept: func(b *stats.Batch) error {
		if b.Node == "busy" {
			return errors.New("collector stopping")
		}
		got = append(got, b)
		return nil
	}}))
	defer srv.Close()
	post := func(body []byte) (int, string) {
		resp, err := http.Post(srv.URL+stats.Path, stats.ContentType, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		msg, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(msg)
	}
	data, _ := stats.Append(nil, batchOf(3))
	if code, msg := post(data); code != http.StatusNoContent {
		t.Errorf("good batch: %d %s", code, msg)
	}
	if len(got) != 1 || len(got[0].Pods) != 3 {
		t.Errorf("accepted %d batches", len(got))
	}
	if code, msg := post([]byte("garbage")); code != http.StatusBadRequest || !strings.Contains(msg, "SSST") {
		t.Errorf("garbage: %d %s", code, msg)
	}
	busy := batchOf(1)
	busy.Node = "busy"
	data, _ = stats.Append(nil, busy)
	if code, msg := post(data); code != http.StatusServiceUnavailable || !strings.Contains(msg, "collector stopping") {
		t.Errorf("refused batch: %d %s", code, msg)
	}
	if code, msg := post(make([]byte, stats.MaxBatchBytes+1)); code != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized batch: %d %s", code, msg)
	}
	resp, err := http.Get(srv.URL + stats.Path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d, want 405", resp.StatusCode)
	}
}

func TestHandlerNodeState(t *testing.T) {
	var got []*stats.Batch
	srv := httptest.NewServer(Handler(Options{Accept: func(b *stats.Batch) error {
		got = append(got, b)
		return nil
	}}))
	defer srv.Close()
	data, _ := stats.Append(nil, batchOf(2))
	post := func(header string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+stats.Path, bytes.NewReader(data))
		req.Header.Set("Content-Type", stats.ContentType)
		if header != "" {
			req.Header.Set(stats.HeaderNodeState, header)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("node state %q: %s, want the batch accepted", header, resp.Status)
		}
	}
	post(stats.NodeState{SocketRedirect: stats.RedirectOff, Reason: "--socket-redirect=off"}.Encode())
	post("")
	post("socket-redirect=sideways")
	if len(got) != 3 {
		t.Fatalf("accepted %d batches, want 3", len(got))
	}
	if ns := got[0].NodeState; ns == nil || ns.SocketRedirect != stats.RedirectOff || ns.Reason != "--socket-redirect=off" {
		t.Errorf("readable state arrived as %+v", ns)
	}
	if got[1].NodeState != nil {
		t.Errorf("no header arrived as %+v, want nil (an older agent, or an activator)", got[1].NodeState)
	}
	// An unreadable state keeps the batch's counts and says why.
	if ns := got[2].NodeState; ns == nil || ns.SocketRedirect != NodeStateUnreadable || !strings.Contains(ns.Reason, `"sideways"`) || len(got[2].Pods) != 2 {
		t.Errorf("unreadable state arrived as %+v with %d pods, want %q naming the value and 2 pods", ns, len(got[2].Pods), NodeStateUnreadable)
	}
}

func TestHandlerAnswersWithItsBuckets(t *testing.T) {
	held := "4;0,2"
	srv := httptest.NewServer(Handler(Options{Accept: func(*stats.Batch) error { return nil }, Buckets: func() string { return held }}))
	defer srv.Close()
	data, _ := stats.Append(nil, batchOf(1))
	for _, want := range []string{"4;0,2", ""} {
		held = want
		resp, err := http.Post(srv.URL+stats.Path, stats.ContentType, bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got, ok := resp.Header[stats.HeaderBuckets]; resp.StatusCode != http.StatusNoContent || (want == "") != !ok || (ok && got[0] != want) {
			t.Errorf("answer %d with %s %q, want 204 with %q (none when empty)", resp.StatusCode, stats.HeaderBuckets, got, want)
		}
	}
}
