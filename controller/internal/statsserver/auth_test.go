package statsserver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/statsauth"
	"github.com/sockscale/sockscale/internal/stats"
)

// fakeAuth knows callers by token.
type fakeAuth map[string]any // *statsauth.Caller or error

func (f fakeAuth) Audience() string { return statsauth.DefaultAudience }

func (f fakeAuth) Authenticate(_ context.Context, token string) (*statsauth.Caller, error) {
	switch v := f[token].(type) {
	case *statsauth.Caller:
		return v, nil
	case error:
		return nil, v
	}
	return nil, fmt.Errorf("%w: token unknown", statsauth.ErrUnauthenticated)
}

// fakePlacer places pods by address: "" for none; targets of workload
// "unwatched" are not watched.
type fakePlacer map[netip.Addr]string

func (f fakePlacer) PodNodes(pods []stats.PodStat) []collector.PodNode {
	out := make([]collector.PodNode, len(pods))
	for i, p := range pods {
		if p.Workload != "unwatched" {
			out[i] = collector.PodNode{Watched: true, Node: f[p.IP]}
		}
	}
	return out
}

var (
	agentA    = &statsauth.Caller{User: "system:serviceaccount:sockscale-system:sockscale-agent", Node: "node-a", Pod: "agent-a", Agent: true}
	activator = &statsauth.Caller{User: "system:serviceaccount:sockscale-system:sockscale-activator", Node: "node-b", Pod: "activator-0", Activator: true}
	unbound   = &statsauth.Caller{User: "system:serviceaccount:sockscale-system:sockscale-agent", Agent: true}
	auth      = fakeAuth{
		"agent-a":   agentA,
		"activator": activator,
		"unbound":   unbound,
		"plain":     fmt.Errorf("%w: system:serviceaccount:default:default may not create nodestats.sockscale.dev (agents) nor targetstats.sockscale.dev (activators)", statsauth.ErrForbidden),
		"down":      fmt.Errorf("%w: TokenReview: connection refused", statsauth.ErrUnavailable),
	}
	placer = fakePlacer{
		netip.MustParseAddr("10.1.0.1"): "node-a",
		netip.MustParseAddr("10.1.0.2"): "node-b",
	}
)

func pod(ip, name, workload string) stats.PodStat {
	return stats.PodStat{IP: netip.MustParseAddr(ip), Namespace: "default", Pod: name, Workload: workload, Concurrency: 50}
}

func encode(t *testing.T, b *stats.Batch) []byte {
	t.Helper()
	data, err := stats.Append(nil, b)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// countingBody says whether the handler read the body.
type countingBody struct {
	r    io.Reader
	read atomic.Int64
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read.Add(int64(n))
	return n, err
}
func (c *countingBody) Close() error { return nil }

func TestHandlerAuth(t *testing.T) {
	start := time.Unix(1700000000, 0)
	agentBatch := &stats.Batch{Node: "node-a", Start: start, Period: time.Second, Pods: []stats.PodStat{pod("10.1.0.1", "hello-1", "hello")}}
	foreignBatch := &stats.Batch{Node: "node-b", Start: start, Period: time.Second, Pods: []stats.PodStat{pod("10.1.0.2", "hello-2", "hello")}}
	targetBatch := &stats.Batch{Node: "activator-0", Start: start, Period: time.Second, Targets: []stats.TargetStat{{Namespace: "default", Workload: "hello", Concurrency: 5}}}
	tests := []struct {
		name      string
		header    string // Authorization
		batch     *stats.Batch
		nodeState bool
		code      int
		msg       string // in the answer
		readBody  bool
		accepted  bool
	}{
		{"no token", "", agentBatch, false, 401, `no bearer token: send a projected ServiceAccount token with audience "sockscale-controller"`, false, false},
		{"not bearer", "Basic YWRtaW46YWRtaW4=", agentBatch, false, 401, "no bearer token", false, false},
		{"invalid token", "Bearer nonsense", agentBatch, false, 401, "unauthenticated: token unknown", false, false},
		{"not allowed", "Bearer plain", agentBatch, false, 403, "may not create nodestats.sockscale.dev", false, false},
		{"API server down", "Bearer down", agentBatch, false, 503, "TokenReview: connection refused", false, false},
		{"agent, own node", "Bearer agent-a", agentBatch, true, 204, "", true, true},
		{"agent, another node", "Bearer agent-a", foreignBatch, false, 403, `the batch is for node "node-b" but the token of system:serviceaccount:sockscale-system:sockscale-agent is bound to a pod on node "node-a"`, true, false},
		{"agent, target records", "Bearer agent-a", &stats.Batch{Node: "node-a", Start: start, Period: time.Second, Targets: targetBatch.Targets}, false, 403, "may not send target records: that takes create on targetstats.sockscale.dev", true, false},
		{"agent, no node in token", "Bearer unbound", agentBatch, false, 403, "token names no node", true, false},
		{"activator", "Bearer activator", targetBatch, false, 204, "", true, true},
		{"activator, pod records", "Bearer activator", agentBatch, false, 403, "may not send pod records or a node state", true, false},
		{"activator, node state", "Bearer activator", &stats.Batch{Node: "activator-0", Start: start, Period: time.Second}, true, 403, "may not send pod records or a node state", true, false},
		{"activator, another's name", "Bearer activator", &stats.Batch{Node: "activator-1", Start: start, Period: time.Second, Targets: targetBatch.Targets}, false, 403, `the batch names activator "activator-1" but the token of system:serviceaccount:sockscale-system:sockscale-activator is bound to pod "activator-0"`, true, false},
		{"both kinds in one batch", "Bearer agent-a", &stats.Batch{Node: "node-a", Start: start, Period: time.Second, Pods: agentBatch.Pods, Targets: targetBatch.Targets}, false, 403, "not both", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var accepted int
			h := Handler(Options{Accept: func(*stats.Batch) error { accepted++; return nil }, Auth: auth, Pods: placer})
			body := &countingBody{r: bytes.NewReader(encode(t, tt.batch))}
			req := httptest.NewRequest(http.MethodPost, stats.Path, body)
			if tt.header != "" {
				req.Header.Set("Authorization", tt.header)
			}
			if tt.nodeState {
				req.Header.Set(stats.HeaderNodeState, stats.NodeState{SocketRedirect: stats.RedirectActive}.Encode())
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.code || !strings.Contains(rec.Body.String(), tt.msg) {
				t.Errorf("answer %d %q, want %d with %q", rec.Code, rec.Body.String(), tt.code, tt.msg)
			}
			if got := body.read.Load() > 0; got != tt.readBody {
				t.Errorf("body read: %v, want %v (an unauthenticated request must cost no read and no decode)", got, tt.readBody)
			}
			if got := accepted == 1; got != tt.accepted {
				t.Errorf("accepted: %v, want %v", got, tt.accepted)
			}
			if tt.code == 401 && rec.Header().Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
		})
	}
}

// TestHandlerDropsForeignPods: an agent's records of pods its node does
// not run are dropped and counted, the rest of the batch is kept, and
// the log says so once per reason per 10 s.
func TestHandlerDropsForeignPods(t *testing.T) {
	var got *stats.Batch
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	var lines []string
	clk := clocktesting.NewFakePassiveClock(time.Unix(1700000000, 0))
	log := NewRateLimitedLog(funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{}), clk)
	h := Handler(Options{Accept: func(b *stats.Batch) error { got = b; return nil }, Auth: auth, Pods: placer, Metrics: m, Log: log})
	b := &stats.Batch{Node: "node-a", Start: time.Unix(1700000000, 0), Period: time.Second, Pods: []stats.PodStat{
		pod("10.1.0.1", "hello-1", "hello"),     // node-a's: kept
		pod("10.1.0.2", "hello-2", "hello"),     // node-b's: wrong_node
		pod("10.1.0.9", "hello-9", "hello"),     // no such endpoint: unknown_pod
		pod("10.1.0.7", "other-7", "unwatched"), // nobody autoscales it: dropped quietly
	}}
	post := func() {
		t.Helper()
		req := httptest.NewRequest(http.MethodPost, stats.Path, bytes.NewReader(encode(t, b)))
		req.Header.Set("Authorization", "Bearer agent-a")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusNoContent {
			t.Fatalf("answer %d %s, want 204: foreign records cost the records, not the batch", rec.Code, rec.Body.String())
		}
	}
	post()
	if diff := cmp.Diff([]stats.PodStat{pod("10.1.0.1", "hello-1", "hello")}, got.Pods, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("records accepted (-want +got):\n%s", diff)
	}
	clk.SetTime(clk.Now().Add(time.Second))
	post()
	want := `
# HELP sockscale_controller_stats_records_rejected_total Pod records dropped from agents' batches, by reason: unknown_pod (not an endpoint of its target), wrong_node (a pod of another node).
# TYPE sockscale_controller_stats_records_rejected_total counter
sockscale_controller_stats_records_rejected_total{reason="unknown_pod"} 2
sockscale_controller_stats_records_rejected_total{reason="wrong_node"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sockscale_controller_stats_records_rejected_total"); err != nil {
		t.Error(err)
	}
	if len(lines) != 2 || !strings.Contains(strings.Join(lines, "\n"), `hello-2 at 10.1.0.2 runs on node \"node-b\"`) {
		t.Errorf("log lines %q: want one per reason in 10 s, naming the pod and its node", lines)
	}
	clk.SetTime(clk.Now().Add(10 * time.Second))
	post()
	if len(lines) != 4 || !strings.Contains(lines[3], `"suppressedSinceLast"=1`) {
		t.Errorf("log lines after 11 s %q: want one more per reason, saying one was left out", lines)
	}
	// With the metrics APIs on, records of pods nobody autoscales stay
	// (they check them against the pods when they read them); the
	// foreign records of watched targets still go.
	h = Handler(Options{Accept: func(b *stats.Batch) error { got = b; return nil }, Auth: auth, Pods: placer, KeepUnwatched: true})
	post()
	if diff := cmp.Diff([]stats.PodStat{pod("10.1.0.1", "hello-1", "hello"), pod("10.1.0.7", "other-7", "unwatched")}, got.Pods, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("records accepted with KeepUnwatched (-want +got):\n%s", diff)
	}
}

// TestHandlerInFlightLimit: beyond MaxInFlight a request gets 503 at
// once, before authentication, and one is served again when a slot
// frees.
func TestHandlerInFlightLimit(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	h := Handler(Options{MaxInFlight: 1, Auth: auth, Pods: placer, Accept: func(*stats.Batch) error {
		entered <- struct{}{}
		<-release
		return nil
	}})
	srv := httptest.NewServer(h)
	defer srv.Close()
	body := encode(t, &stats.Batch{Node: "node-a", Start: time.Unix(1700000000, 0), Period: time.Second})
	post := func(token string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+stats.Path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		defer resp.Body.Close()
		msg, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(msg)
	}
	done := make(chan int)
	go func() { code, _ := post("agent-a"); done <- code }()
	<-entered
	if code, msg := post("nonsense"); code != http.StatusServiceUnavailable || !strings.Contains(msg, "1 requests already in flight") {
		t.Errorf("second request while one is in flight: %d %q, want 503", code, msg)
	}
	close(release)
	if code := <-done; code != http.StatusNoContent {
		t.Errorf("first request: %d, want 204", code)
	}
	if code, _ := post("agent-a"); code != http.StatusNoContent {
		t.Errorf("after the first finished: %d, want 204", code)
	}
}
