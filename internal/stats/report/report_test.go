package report

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/internal/testutil/statssink"
)

type counts struct {
	ok, fail, refused int
	errors            map[string]int
	lock              sync.Mutex
}

func (c *counts) Refused() {
	c.lock.Lock()
	defer c.lock.Unlock()
	c.refused++
}

func (c *counts) Report(ok bool) {
	c.lock.Lock()
	defer c.lock.Unlock()
	if ok {
		c.ok++
	} else {
		c.fail++
	}
}
func (c *counts) Error(stage string) {
	c.lock.Lock()
	defer c.lock.Unlock()
	if c.errors == nil {
		c.errors = map[string]int{}
	}
	c.errors[stage]++
}

func TestSendReachesEveryReplica(t *testing.T) {
	var mu sync.Mutex
	received := map[string]int{}
	server := func(name string) *httptest.Server {
		return httptest.NewServer(replica(func(b *stats.Batch) {
			mu.Lock()
			defer mu.Unlock()
			received[name] += len(b.Pods)
		}))
	}
	a, b := server("a"), server("b")
	defer a.Close()
	defer b.Close()
	// Both replicas listen on loopback; give them one port by resolving the
	// Service name to both listeners' host:port pairs through a fake
	// resolver that returns addresses, and the port from the target.
	_, portA, _ := net.SplitHostPort(a.Listener.Addr().String())
	_, portB, _ := net.SplitHostPort(b.Listener.Addr().String())
	rec := &counts{}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, port := range []string{portA, portB} {
		r, err := New("controller-stats.sockscale-system.svc:"+port, time.Second, rec, log)
		if err != nil {
			t.Fatal(err)
		}
		r.resolve = func(context.Context, string) ([]string, error) { return []string{"127.0.0.1"}, nil }
		r.Send(context.Background(), &stats.Batch{Node: "n", Start: time.Now(), Period: time.Second,
			Pods: []stats.PodStat{{IP: netip.MustParseAddr("10.0.0.1"), Namespace: "ns", Pod: "p", Workload: "w", Concurrency: 1}}})
	}
	if received["a"] != 1 || received["b"] != 1 || rec.ok != 2 || rec.fail != 0 {
		t.Errorf("received %v, ok=%d fail=%d; want one pod at each replica", received, rec.ok, rec.fail)
	}
}

func TestSendCountsRefusals(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "stats: not the leader yet", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	rec := &counts{}
	r, err := New(srv.Listener.Addr().String(), time.Second, rec, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	r.Send(context.Background(), &stats.Batch{Node: "n", Start: time.Now(), Period: time.Second})
	if rec.fail != 1 || rec.ok != 0 {
		t.Errorf("ok=%d fail=%d, want the refusal counted as a failure", rec.ok, rec.fail)
	}
}

func TestNewRejectsBadTarget(t *testing.T) {
	for _, target := range []string{"", "controller", ":8443", "host:"} {
		if _, err := New(target, time.Second, &counts{}, nil); err == nil {
			t.Errorf("New(%q) accepted a target without host and port", target)
		}
	}
}

func TestOfferKeepsNewest(t *testing.T) {
	r, _ := New("h:1", time.Second, &counts{}, nil)
	r.Offer(&stats.Batch{Node: "old"})
	r.Offer(&stats.Batch{Node: "new"})
	if b := <-r.queue; b.Node != "new" {
		t.Errorf("queued %q, want the newest batch", b.Node)
	}
}

// replica stands in for a controller replica's stats handler.
func replica(accept func(*stats.Batch)) http.Handler { return statssink.Handler(accept) }

func TestSendCarriesNodeState(t *testing.T) {
	got := make(chan *stats.Batch, 2)
	srv := httptest.NewServer(replica(func(b *stats.Batch) { got <- b }))
	defer srv.Close()
	r, err := New(srv.Listener.Addr().String(), time.Second, &counts{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	want := stats.NodeState{SocketRedirect: stats.RedirectSyncing, Reason: "watch Services: forbidden"}
	r.Send(t.Context(), &stats.Batch{Node: "n", Start: time.Now(), Period: time.Second, NodeState: &want})
	if b := <-got; b.NodeState == nil || *b.NodeState != want {
		t.Errorf("node state arrived as %+v, want %+v", b.NodeState, want)
	}
	r.Send(t.Context(), &stats.Batch{Node: "activator-0", Start: time.Now(), Period: time.Second})
	if b := <-got; b.NodeState != nil {
		t.Errorf("a batch without node state arrived with %+v", b.NodeState)
	}
}

// TestSendCarriesTheTokenReadAgain: every send reads the token file again
// (the kubelet rotates it), and a 401 or 403 is counted as refused, not
// as a failure, with the controller's message in the log.
func TestSendCarriesTheTokenReadAgain(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, r.Header.Get("Authorization"))
		if r.Header.Get("Authorization") == "Bearer revoked" {
			http.Error(w, "stats: forbidden: system:serviceaccount:x:y may not create nodestats.sockscale.dev", http.StatusForbidden)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	file := filepath.Join(t.TempDir(), "token")
	rec := &counts{}
	var logs bytes.Buffer
	r, err := New(srv.Listener.Addr().String(), time.Second, rec, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	r.SetTokenFile(file)
	batch := &stats.Batch{Node: "n", Start: time.Now(), Period: time.Second}
	for _, tok := range []string{"first\n", "second", "revoked"} {
		if err := os.WriteFile(file, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
		r.Send(t.Context(), batch)
	}
	if diff := cmp.Diff([]string{"Bearer first", "Bearer second", "Bearer revoked"}, seen); diff != "" {
		t.Errorf("Authorization headers (-want +got):\n%s", diff)
	}
	if rec.ok != 2 || rec.fail != 0 || rec.refused != 1 {
		t.Errorf("ok=%d fail=%d refused=%d, want 2, 0, 1", rec.ok, rec.fail, rec.refused)
	}
	if !strings.Contains(logs.String(), "may not create nodestats.sockscale.dev") {
		t.Errorf("the log does not carry the controller's message:\n%s", logs.String())
	}
	// No token file: nothing is sent, and the error is counted.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	r.Send(t.Context(), batch)
	if len(seen) != 3 {
		t.Errorf("a batch went out without its token: %q", seen)
	}
}

// TestSendRoutesRecordsToTheirBuckets: two replicas on one port (two
// loopback addresses). Until they have answered, each gets every record;
// once each has named its buckets, each gets only its buckets' records,
// and the node state and target records still reach both. A standby
// (no buckets) gets only records no one claims; a replica that stops
// naming buckets, or names them unreadably, gets everything again.
func TestSendRoutesRecordsToTheirBuckets(t *testing.T) {
	l1, l2, port := twoReplicas(t)
	var mu sync.Mutex
	answer := map[string]string{"127.0.0.2": "2;0", "127.0.0.3": "2;1"}
	got := map[string]*stats.Batch{}
	serve := func(l net.Listener, addr string) {
		srv := &httptest.Server{Listener: l, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			mu.Lock()
			if v := answer[addr]; v != "" {
				w.Header().Set(stats.HeaderBuckets, v)
			}
			mu.Unlock()
			replica(func(b *stats.Batch) {
				mu.Lock()
				defer mu.Unlock()
				got[addr] = b
			}).ServeHTTP(w, req)
		})}}
		srv.Start()
		t.Cleanup(srv.Close)
	}
	serve(l1, "127.0.0.2")
	serve(l2, "127.0.0.3")

	rec := &counts{}
	r, err := New("controller-stats:"+port, time.Second, rec, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	r.SetResolver(func(context.Context, string) ([]string, error) { return []string{"127.0.0.2", "127.0.0.3"}, nil })
	batch := &stats.Batch{Node: "n", Start: time.Now(), Period: time.Second,
		NodeState: &stats.NodeState{SocketRedirect: stats.RedirectActive},
		Targets:   []stats.TargetStat{{Namespace: "default", Workload: "held", Concurrency: 1}}}
	wantOf := map[string][]string{}
	for i := range 20 {
		w := fmt.Sprintf("w-%d", i)
		batch.Pods = append(batch.Pods, stats.PodStat{IP: netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}), Namespace: "default", Pod: w + "-0", Workload: w, Concurrency: 1})
		addr := []string{"127.0.0.2", "127.0.0.3"}[stats.BucketOf("default", w, 2)]
		wantOf[addr] = append(wantOf[addr], w)
	}
	all := func() []string {
		var ws []string
		for _, p := range batch.Pods {
			ws = append(ws, p.Workload)
		}
		return ws
	}()
	check := func(step string, want map[string][]string) {
		t.Helper()
		r.Send(t.Context(), batch)
		mu.Lock()
		defer mu.Unlock()
		for addr, b := range got {
			var ws []string
			for _, p := range b.Pods {
				ws = append(ws, p.Workload)
			}
			if diff := cmp.Diff(want[addr], ws); diff != "" {
				t.Errorf("%s: workloads posted to %s (-want +got):\n%s", step, addr, diff)
			}
			if b.NodeState == nil || len(b.Targets) != 1 {
				t.Errorf("%s: %s got node state %v and %d target records, want both", step, addr, b.NodeState, len(b.Targets))
			}
		}
		clear(got)
	}
	check("before any answer", map[string][]string{"127.0.0.2": all, "127.0.0.3": all})
	if len(wantOf["127.0.0.2"]) == 0 || len(wantOf["127.0.0.3"]) == 0 {
		t.Fatalf("20 workloads fell into one bucket: %v", wantOf)
	}
	check("both named their buckets", wantOf)
	mu.Lock()
	answer["127.0.0.3"] = "2;" // gives bucket 1 up; no one claims it yet
	mu.Unlock()
	check("one named its buckets again", wantOf) // routed by the last answers
	check("bucket 1 unclaimed", map[string][]string{"127.0.0.2": all, "127.0.0.3": wantOf["127.0.0.3"]})
	mu.Lock()
	answer["127.0.0.3"] = "2;7"
	mu.Unlock()
	check("before the unreadable answer", map[string][]string{"127.0.0.2": all, "127.0.0.3": wantOf["127.0.0.3"]})
	check("after the unreadable answer", map[string][]string{"127.0.0.2": all, "127.0.0.3": all})
	if rec.fail != 0 || rec.ok != 2*6 {
		t.Errorf("ok=%d fail=%d, want every post taken", rec.ok, rec.fail)
	}
}

// TestSendFallsBackForOlderReplicas: a replica that answers a version 3
// batch with 400 (a controller from before version 3, during a rolling
// upgrade) gets the stats without the pods' accounting for LegacyPeriod,
// said once in the log, then version 3 again; its peer that reads
// version 3 gets the accounting throughout.
func TestSendFallsBackForOlderReplicas(t *testing.T) {
	l1, l2, port := twoReplicas(t)
	const older, newer = "127.0.0.2", "127.0.0.3"
	var mu sync.Mutex
	got := map[string]*stats.Batch{}
	serve := func(l net.Listener, addr string) {
		accept := replica(func(b *stats.Batch) {
			mu.Lock()
			defer mu.Unlock()
			got[addr] = b
		})
		srv := &httptest.Server{Listener: l, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			body, _ := io.ReadAll(req.Body)
			if addr == older && len(body) > 4 && body[4] == 3 {
				// What a controller from before version 3 answers.
				http.Error(w, "stats: malformed stats batch: version 3, this controller reads versions 1 and 2", http.StatusBadRequest)
				return
			}
			req.Body = io.NopCloser(bytes.NewReader(body))
			accept.ServeHTTP(w, req)
		})}}
		srv.Start()
		t.Cleanup(srv.Close)
	}
	serve(l1, older)
	serve(l2, newer)

	var logged bytes.Buffer
	var logMu sync.Mutex
	rec := &counts{}
	r, err := New("controller-stats:"+port, time.Second, rec, slog.New(slog.NewTextHandler(&lockedWriter{w: &logged, mu: &logMu}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_700_000_000, 0))
	r.clock = clk
	r.SetResolver(func(context.Context, string) ([]string, error) { return []string{older, newer}, nil })
	tls := stats.PodStat{IP: netip.MustParseAddr("10.0.0.1"), Namespace: "ns", Pod: "tls-0", Workload: "tls",
		Concurrency: 2, Accounting: stats.AccountingConnections, OpaqueConcurrency: 2}
	batch := &stats.Batch{Node: "n", Start: clk.Now(), Period: time.Second, Pods: []stats.PodStat{tls}}
	plain := tls
	plain.Accounting, plain.OpaqueConcurrency = stats.AccountingHTTP1Requests, 0
	fallbacks := func() int {
		logMu.Lock()
		defer logMu.Unlock()
		return strings.Count(logged.String(), "cannot read stats version 3")
	}
	step := func(name string, want map[string]*stats.PodStat, wantLogs int) {
		t.Helper()
		r.Send(t.Context(), batch)
		mu.Lock()
		defer mu.Unlock()
		for _, addr := range []string{older, newer} {
			var gotPod *stats.PodStat
			if b := got[addr]; b != nil && len(b.Pods) == 1 {
				gotPod = &b.Pods[0]
			}
			if diff := cmp.Diff(want[addr], gotPod, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("%s: the pod posted to %s (-want +got):\n%s", name, addr, diff)
			}
		}
		clear(got)
		if n := fallbacks(); n != wantLogs {
			t.Errorf("%s: %d log lines about the fallback, want %d", name, n, wantLogs)
		}
	}
	step("first batch", map[string]*stats.PodStat{newer: &tls}, 1)
	for i := range 3 {
		clk.SetTime(clk.Now().Add(LegacyPeriod / 4))
		step(fmt.Sprintf("batch %d within the period", i+2), map[string]*stats.PodStat{older: &plain, newer: &tls}, 1)
	}
	clk.SetTime(clk.Now().Add(LegacyPeriod / 4))
	step("the period over: version 3 tried again", map[string]*stats.PodStat{newer: &tls}, 2)
	step("back to the fallback", map[string]*stats.PodStat{older: &plain, newer: &tls}, 2)
	if rec.fail != 2 || rec.refused != 0 {
		t.Errorf("%d posts failed and %d were refused, want the 2 of version 3 to the older replica, and none", rec.fail, rec.refused)
	}
}

// TestSendDropsOnlyIPv6ForOlderReplicas: a replica that answers a
// version 4 batch (an IPv6-only pod's record) with 400 still gets the
// IPv4 pods' records, in the newest version it reads, for LegacyPeriod:
// version 3 with the accounting for a controller from before version 4,
// version 1 without it for one from before version 3 (which refuses the
// version 3 batch next). Each left-out record set is counted, each
// refusal logged once.
func TestSendDropsOnlyIPv6ForOlderReplicas(t *testing.T) {
	l1, l2, port := twoReplicas(t)
	const reads3, reads2 = "127.0.0.2", "127.0.0.3"
	var mu sync.Mutex
	got := map[string][]byte{}
	serve := func(l net.Listener, addr string, newest byte) {
		accept := replica(func(*stats.Batch) {})
		srv := &httptest.Server{Listener: l, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			body, _ := io.ReadAll(req.Body)
			if len(body) > 4 && body[4] > newest {
				http.Error(w, fmt.Sprintf("stats: malformed stats batch: version %d, this controller reads versions 1 to %d", body[4], newest), http.StatusBadRequest)
				return
			}
			mu.Lock()
			got[addr] = body
			mu.Unlock()
			req.Body = io.NopCloser(bytes.NewReader(body))
			accept.ServeHTTP(w, req)
		})}}
		srv.Start()
		t.Cleanup(srv.Close)
	}
	serve(l1, reads3, 3)
	serve(l2, reads2, 2)

	var logged bytes.Buffer
	var logMu sync.Mutex
	rec := &counts{}
	r, err := New("controller-stats:"+port, time.Second, rec, slog.New(slog.NewTextHandler(&lockedWriter{w: &logged, mu: &logMu}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_700_000_000, 0))
	r.clock = clk
	r.SetResolver(func(context.Context, string) ([]string, error) { return []string{reads3, reads2}, nil })
	plain := stats.PodStat{IP: netip.MustParseAddr("10.0.0.1"), Namespace: "ns", Pod: "plain-0", Workload: "plain", Concurrency: 1}
	tls := stats.PodStat{IP: netip.MustParseAddr("10.0.0.2"), Namespace: "ns", Pod: "tls-0", Workload: "tls",
		Concurrency: 2, Accounting: stats.AccountingConnections, OpaqueConcurrency: 2}
	v6 := stats.PodStat{IP: netip.MustParseAddr("fd00::3"), Namespace: "ns", Pod: "v6-0", Workload: "v6", Concurrency: 3}
	batch := &stats.Batch{Node: "n", Start: clk.Now(), Period: time.Second, Pods: []stats.PodStat{plain, tls, v6}}
	tlsPlain := tls
	tlsPlain.Accounting, tlsPlain.OpaqueConcurrency = stats.AccountingHTTP1Requests, 0

	type post struct {
		Version byte
		Pods    []stats.PodStat
	}
	step := func(name string, want map[string]post, wantLogs4, wantLogs3, wantDropped int) {
		t.Helper()
		r.Send(t.Context(), batch)
		mu.Lock()
		defer mu.Unlock()
		gotPosts := map[string]post{}
		for addr, body := range got {
			b, err := stats.Decode(body)
			if err != nil {
				t.Fatalf("%s: %s got an undecodable batch: %v", name, addr, err)
			}
			gotPosts[addr] = post{body[4], b.Pods}
		}
		if diff := cmp.Diff(want, gotPosts, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
			t.Errorf("%s: posts taken by replica (-want +got):\n%s", name, diff)
		}
		clear(got)
		logMu.Lock()
		n4, n3 := strings.Count(logged.String(), "cannot read stats version 4"), strings.Count(logged.String(), "cannot read stats version 3")
		logMu.Unlock()
		if n4 != wantLogs4 || n3 != wantLogs3 {
			t.Errorf("%s: %d and %d log lines about versions 4 and 3, want %d and %d", name, n4, n3, wantLogs4, wantLogs3)
		}
		rec.lock.Lock()
		defer rec.lock.Unlock()
		if n := rec.errors[StageLegacyIPv6]; n != wantDropped {
			t.Errorf("%s: %d posts counted as leaving out IPv6 records, want %d", name, n, wantDropped)
		}
	}
	ipv4Only := post{3, []stats.PodStat{plain, tls}}
	step("first batch: version 4 refused by both", map[string]post{}, 2, 0, 0)
	clk.SetTime(clk.Now().Add(LegacyPeriod / 4))
	step("version 3 without the IPv6 pod", map[string]post{reads3: ipv4Only}, 2, 1, 2)
	for i := range 2 {
		clk.SetTime(clk.Now().Add(LegacyPeriod / 4))
		step(fmt.Sprintf("batch %d within the period", i+3),
			map[string]post{reads3: ipv4Only, reads2: {1, []stats.PodStat{plain, tlsPlain}}}, 2, 1, 4+2*i)
	}
	// The first replica's period is over, the second's (from its refusal
	// of version 3, a quarter later) is not.
	clk.SetTime(clk.Now().Add(LegacyPeriod / 4))
	step("the period over: version 4 tried again", map[string]post{reads2: {1, []stats.PodStat{plain, tlsPlain}}}, 3, 1, 7)
	if rec.refused != 0 || rec.fail != 4 {
		t.Errorf("%d posts failed and %d were refused, want the 4 answered 400, and none", rec.fail, rec.refused)
	}
}

// lockedWriter serialises the writes of the replicas' goroutines to w.
type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// twoReplicas listens on one port of two loopback addresses, 127.0.0.2
// and 127.0.0.3: two controller replicas behind one address each.
func twoReplicas(t *testing.T) (l1, l2 net.Listener, port string) {
	t.Helper()
	l1, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no second loopback address to listen on: %v", err)
	}
	_, port, _ = net.SplitHostPort(l1.Addr().String())
	l2, err = net.Listen("tcp", "127.0.0.3:"+port)
	if err != nil {
		t.Fatalf("listen on 127.0.0.3:%s beside 127.0.0.2: %v", port, err)
	}
	return l1, l2, port
}
