package loadgen

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

func TestClosedLoopCountsAndSpans(t *testing.T) {
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(20 * time.Millisecond)
		if r.Header.Get("X-Test") != "yes" {
			http.Error(w, "header missing", http.StatusBadRequest)
		}
		served.Add(1)
	}))
	defer srv.Close()
	from := time.Now()
	res := Run(Options{URLs: []string{srv.URL}, Concurrency: 4, KeepAlive: true, Spans: true, Header: http.Header{"X-Test": {"yes"}}}, 300*time.Millisecond)
	to := time.Now()
	if res.Completed != served.Load() || res.Completed == 0 || res.Failed != 0 {
		t.Errorf("completed %d failed %d, server served %d", res.Completed, res.Failed, served.Load())
	}
	if len(res.Spans) != int(res.Completed) || len(res.Latencies) != int(res.Completed) {
		t.Errorf("%d spans and %d latencies for %d requests", len(res.Spans), len(res.Latencies), res.Completed)
	}
	// 4 clients always busy: the in-flight integral over the run is close
	// to 4 times its length (a client is idle only between requests).
	if c := res.InFlightArea(from, to).Seconds() / to.Sub(from).Seconds(); c < 3.5 || c > 4.01 {
		t.Errorf("client-side concurrency %.2f, want about 4", c)
	}
	if p := res.Percentile(0.5); p < 20*time.Millisecond {
		t.Errorf("median latency %v below the handler's 20ms", p)
	}
}

// An error status is an answer but a failed request.
func TestErrorStatusIsAFailure(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	res := Run(Options{URLs: []string{srv.URL}, Concurrency: 2, KeepAlive: true}, 100*time.Millisecond)
	if res.Completed != 0 || res.Failed == 0 {
		t.Errorf("completed %d failed %d, want every 503 failed", res.Completed, res.Failed)
	}
}
