package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func newApp() *app {
	return &app{pod: "autoscale-0", log: slog.New(slog.DiscardHandler)}
}

// get sends one request through the handler and returns code and body.
func get(t *testing.T, h http.Handler, target string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	return rec.Code, rec.Body.String()
}

func TestWork(t *testing.T) {
	tests := []struct {
		name   string
		target string
		want   string // the whole body
	}{
		{"nothing", "/", "pod autoscale-0: did nothing (ask with ?sleep=100&prime=10000&bloat=10)\n"},
		{"sleep in milliseconds", "/?sleep=20", "pod autoscale-0: slept 20ms\n"},
		{"sleep as a duration", "/?sleep=15ms", "pod autoscale-0: slept 15ms\n"},
		{"sleep 0", "/?sleep=0", "pod autoscale-0: did nothing (ask with ?sleep=100&prime=10000&bloat=10)\n"},
		// pi(100) = 25, pi(10^6) = 78498: known values, so the sieve is right.
		{"prime", "/?prime=100", "pod autoscale-0: found 25 primes up to 100, the largest 97\n"},
		{"prime 2", "/?prime=2", "pod autoscale-0: found 1 primes up to 2, the largest 2\n"},
		{"prime 1 has none", "/?prime=1", "pod autoscale-0: found 0 primes up to 1, the largest 0\n"},
		{"prime a million", "/?prime=1000000", "pod autoscale-0: found 78498 primes up to 1000000, the largest 999983\n"},
		{"bloat", "/?bloat=3", "pod autoscale-0: allocated 3 MB\n"},
		{"all three", "/?sleep=5&prime=10&bloat=1", "pod autoscale-0: allocated 1 MB; found 4 primes up to 10, the largest 7; slept 5ms\n"},
	}
	h := newApp().handler()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := get(t, h, tt.target)
			if code != http.StatusOK {
				t.Fatalf("GET %s: status %d, body %q", tt.target, code, body)
			}
			if diff := cmp.Diff(tt.want, body); diff != "" {
				t.Errorf("GET %s: body (-want +got):\n%s", tt.target, diff)
			}
		})
	}
}

// A sleeping request really stays in flight for its sleep: what the
// autoscaler measures. Only a lower bound is checked (no upper: shared CI).
func TestSleepHoldsTheRequest(t *testing.T) {
	start := time.Now()
	if code, body := get(t, newApp().handler(), "/?sleep=50ms"); code != http.StatusOK {
		t.Fatalf("status %d, body %q", code, body)
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("request took %s, want >= 50ms", d)
	}
}

// Each answer says how many requests were in flight when it started,
// itself included: the second of two overlapping requests says 2, a
// request after both says 1.
func TestInFlightHeader(t *testing.T) {
	a := newApp()
	h := a.handler()
	inFlight := func(target string) string {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
		return rec.Header().Get(InFlightHeader)
	}
	first := make(chan string, 1)
	go func() { first <- inFlight("/?sleep=300ms") }()
	waitFor(t, func() bool { return a.inFlight.Load() == 1 }) // the first is sleeping
	if got := inFlight("/"); got != "2" {
		t.Errorf("a request while another sleeps: %s %q, want 2", InFlightHeader, got)
	}
	if got := <-first; got != "1" {
		t.Errorf("the first request: %s %q, want 1", InFlightHeader, got)
	}
	if got := inFlight("/"); got != "1" {
		t.Errorf("a request alone: %s %q, want 1", InFlightHeader, got)
	}
}

// Each answer says how long the listener had been open when the request
// arrived, in microseconds: at least the time since the app noted it,
// more on a later request; nothing when the app does not know.
func TestListeningForHeader(t *testing.T) {
	listeningFor := func(a *app) (time.Duration, bool) {
		t.Helper()
		rec := httptest.NewRecorder()
		a.handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		v := rec.Header().Get(ListeningForHeader)
		if v == "" {
			return 0, false
		}
		us, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("%s %q: not whole microseconds", ListeningForHeader, v)
		}
		return time.Duration(us) * time.Microsecond, true
	}
	a := newApp()
	if d, ok := listeningFor(a); ok {
		t.Errorf("listener open time unknown: %s %s, want no header", ListeningForHeader, d)
	}
	a.listening = time.Now().Add(-1500 * time.Millisecond)
	first, ok := listeningFor(a)
	if !ok || first < 1500*time.Millisecond {
		t.Fatalf("listening for 1.5 s: %s %s (sent %v), want >= 1.5s", ListeningForHeader, first, ok)
	}
	time.Sleep(2 * time.Millisecond)
	if later, _ := listeningFor(a); later <= first {
		t.Errorf("a later request: %s, the first %s; want more", later, first)
	}
}

func TestPrimesModel(t *testing.T) {
	// Compare the bit sieve with trial division for every n up to 2000.
	isPrime := func(n int) bool {
		if n < 2 {
			return false
		}
		for d := 2; d*d <= n; d++ {
			if n%d == 0 {
				return false
			}
		}
		return true
	}
	count, largest := 0, 0
	for n := 0; n <= 2000; n++ {
		if isPrime(n) {
			count, largest = count+1, n
		}
		if c, l := primes(n); c != count || l != largest {
			t.Fatalf("primes(%d) = %d, %d; want %d, %d", n, c, l, count, largest)
		}
	}
}

func TestBadParameters(t *testing.T) {
	tests := []struct {
		target string
		want   []string // substrings of the 400's body
	}{
		{"/?sleep=abc", []string{`sleep="abc"`, "milliseconds", "Go duration", "10m"}},
		{"/?sleep=-5", []string{`sleep="-5"`, "from 0 to 10m"}},
		{"/?sleep=-5ms", []string{`sleep="-5ms"`}},
		{"/?sleep=600001", []string{`sleep="600001"`}},
		{"/?sleep=11m", []string{`sleep="11m"`}},
		{"/?prime=x", []string{`prime="x"`, "from 0 to 40000000"}},
		{"/?prime=40000001", []string{`prime="40000001"`, "40000000"}},
		{"/?prime=-1", []string{`prime="-1"`}},
		{"/?bloat=1025", []string{`bloat="1025"`, "megabytes", "0 to 1024"}},
		{"/?bloat=1.5", []string{`bloat="1.5"`}},
		{"/?slep=100", []string{`slep="100"`, "no such parameter", "sleep, prime, bloat"}},
		{"/?sleep=1&sleep=2", []string{`sleep="1,2"`, "a single value"}},
		// Every bad parameter is named, not only the first.
		{"/?sleep=x&bloat=y", []string{`sleep="x"`, `bloat="y"`}},
	}
	h := newApp().handler()
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			code, body := get(t, h, tt.target)
			if code != http.StatusBadRequest {
				t.Fatalf("GET %s: status %d, want 400; body %q", tt.target, code, body)
			}
			for _, w := range tt.want {
				if !strings.Contains(body, w) {
					t.Errorf("GET %s: body %q does not contain %q", tt.target, body, w)
				}
			}
		})
	}
}

// The limits themselves are allowed.
func TestLimitsAccepted(t *testing.T) {
	for _, q := range []string{"sleep=600000", "sleep=10m", "prime=40000000", "bloat=1024"} {
		w, err := parseWork(mustQuery(t, q))
		if err != nil {
			t.Errorf("%s: %v", q, err)
		}
		if w == (work{}) {
			t.Errorf("%s: parsed to no work", q)
		}
	}
}

func TestRoutes(t *testing.T) {
	h := newApp().handler()
	for _, tt := range []struct {
		method, target string
		want           int
	}{
		{http.MethodGet, "/", http.StatusOK},
		{http.MethodHead, "/", http.StatusOK},
		{http.MethodPost, "/", http.StatusMethodNotAllowed},
		{http.MethodGet, "/other", http.StatusNotFound},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.target, nil))
		if rec.Code != tt.want {
			t.Errorf("%s %s: status %d, want %d", tt.method, tt.target, rec.Code, tt.want)
		}
	}
}

func TestHealth(t *testing.T) {
	a := newApp()
	h := a.handler()
	if code, _ := get(t, h, "/healthz"); code != http.StatusServiceUnavailable {
		t.Errorf("starting: /healthz %d, want 503", code)
	}
	a.ready.Store(true)
	if code, _ := get(t, h, "/healthz"); code != http.StatusOK {
		t.Errorf("ready: /healthz %d, want 200", code)
	}
}

// A client that goes away ends its sleeping request at once.
func TestClientGoneEndsSleep(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/?sleep=10m", nil)
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() {
		newApp().handler().ServeHTTP(rec, req)
		close(done)
	}()
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler still sleeps after its client went away")
	}
}

// The server as main runs it: not ready during the startup delay, then
// ready; after SIGTERM (ctx cancelled) not ready while it keeps serving,
// and the request in flight completes before serve returns.
func TestStartupAndDrain(t *testing.T) {
	ln := listen(t)
	a := newApp()
	ctx, sigterm := context.WithCancel(context.Background())
	defer sigterm()
	// The shutdown delay (1s) leaves ample time to see /healthz at 503 while
	// the listener is still open; the request in flight (2s) outlasts it,
	// so the graceful shutdown has to wait for it.
	o := options{startupDelay: time.Hour, shutdownDelay: time.Second, drainTimeout: time.Minute}
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, nil, a, o) }()
	base := "http://" + ln.Addr().String()

	if code := status(t, base+"/healthz"); code != http.StatusServiceUnavailable {
		t.Errorf("during the startup delay: /healthz %d, want 503", code)
	}
	// The startup delay is an hour: mark ready as its timer would, to
	// check the rest without waiting (TestStartupDelayEnds covers the timer).
	a.ready.Store(true)
	if code := status(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("ready: /healthz %d, want 200", code)
	}

	// A request in flight when SIGTERM comes.
	slow := make(chan result, 1)
	go func() { slow <- fetch(base + "/?sleep=2s") }()
	waitFor(t, func() bool { return a.inFlight.Load() == 1 })
	sigterm()
	waitFor(t, func() bool { return !a.ready.Load() })
	if code := status(t, base+"/healthz"); code != http.StatusServiceUnavailable {
		t.Errorf("draining: /healthz %d, want 503", code)
	}
	r := <-slow
	if r.err != nil || r.code != http.StatusOK || !strings.Contains(r.body, "slept 2s") {
		t.Errorf("request in flight at SIGTERM: %d %q %v, want 200 slept 2s", r.code, r.body, r.err)
	}
	if err := <-done; err != nil {
		t.Errorf("serve: %v", err)
	}
}

func TestStartupDelayEnds(t *testing.T) {
	ln := listen(t)
	a := newApp()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, ln, nil, a, options{startupDelay: 20 * time.Millisecond, drainTimeout: 5 * time.Second})
	}()
	waitFor(t, func() bool { return status(t, "http://"+ln.Addr().String()+"/healthz") == http.StatusOK })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("serve: %v", err)
	}
}

// A request longer than --drain-timeout is cut off and serve says so.
func TestDrainTimeout(t *testing.T) {
	ln := listen(t)
	a := newApp()
	ctx, sigterm := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, nil, a, options{drainTimeout: 50 * time.Millisecond}) }()
	slow := make(chan result, 1)
	go func() { slow <- fetch("http://" + ln.Addr().String() + "/?sleep=10m") }()
	waitFor(t, func() bool { return a.inFlight.Load() == 1 })
	sigterm()
	err := <-done
	if err == nil || !strings.Contains(err.Error(), "1 requests still in flight after 50ms") {
		t.Errorf("serve: %v, want the drain timeout with 1 request in flight", err)
	}
	if r := <-slow; r.err == nil {
		t.Errorf("cut-off request: %d %q, want a connection error", r.code, r.body)
	}
}

func TestParseFlags(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    options
		wantErr string
	}{
		{name: "defaults", want: options{port: 8080, shutdownDelay: 3 * time.Second, drainTimeout: 25 * time.Second}},
		{name: "PORT", env: map[string]string{"PORT": "9000"}, want: options{port: 9000, shutdownDelay: 3 * time.Second, drainTimeout: 25 * time.Second}},
		{name: "--port wins over PORT", args: []string{"--port=7000"}, env: map[string]string{"PORT": "9000"},
			want: options{port: 7000, shutdownDelay: 3 * time.Second, drainTimeout: 25 * time.Second}},
		{name: "all", args: []string{"--startup-delay=2s", "--shutdown-delay=0s", "--drain-timeout=1m"},
			want: options{port: 8080, startupDelay: 2 * time.Second, drainTimeout: time.Minute}},
		{name: "exit on SIGTERM", args: []string{"--exit-on-sigterm"},
			want: options{port: 8080, shutdownDelay: 3 * time.Second, drainTimeout: 25 * time.Second, exitOnSIGTERM: true}},
		{name: "gRPC", args: []string{"--grpc-port=9090"},
			want: options{port: 8080, shutdownDelay: 3 * time.Second, drainTimeout: 25 * time.Second, grpcPort: 9090}},
		{name: "gRPC off", args: []string{"--grpc-port=0"},
			want: options{port: 8080, shutdownDelay: 3 * time.Second, drainTimeout: 25 * time.Second}},
		{name: "bad PORT", env: map[string]string{"PORT": "http"}, wantErr: `$PORT "http"`},
		{name: "gRPC port out of range", args: []string{"--grpc-port=65536"}, wantErr: "--grpc-port 65536: want 1 to 65535, or 0 for no gRPC"},
		{name: "negative gRPC port", args: []string{"--grpc-port=-1"}, wantErr: "--grpc-port -1"},
		{name: "gRPC on the HTTP port", args: []string{"--grpc-port=8080"}, wantErr: "--grpc-port 8080: the HTTP port (--port)"},
		{name: "gRPC on PORT", args: []string{"--grpc-port=9000"}, env: map[string]string{"PORT": "9000"}, wantErr: "--grpc-port 9000: the HTTP port"},
		{name: "gRPC port not a number", args: []string{"--grpc-port=grpc"}, wantErr: "grpc-port"},
		{name: "port out of range", args: []string{"--port=70000"}, wantErr: "--port 70000"},
		{name: "negative delay", args: []string{"--startup-delay=-1s"}, wantErr: "--startup-delay -1s"},
		{name: "arguments", args: []string{"serve"}, wantErr: "flags only"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseFlags(tt.args, env(tt.env), io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(options{})); diff != "" {
				t.Errorf("options (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPodName(t *testing.T) {
	host := func() (string, error) { return "host-1", nil }
	noHost := func() (string, error) { return "", errors.New("no hostname") }
	for _, tt := range []struct {
		env  string
		host func() (string, error)
		want string
	}{
		{"pod-a", host, "pod-a"},
		{"", host, "host-1"},
		{"", noHost, "unknown"},
	} {
		got := podName(func(string) string { return tt.env }, tt.host)
		if got != tt.want {
			t.Errorf("POD_NAME=%q: podName = %q, want %q", tt.env, got, tt.want)
		}
	}
}

type result struct {
	code int
	body string
	err  error
}

func fetch(url string) result {
	resp, err := http.Get(url)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return result{code: resp.StatusCode, body: string(b), err: err}
}

func status(t *testing.T, url string) int {
	t.Helper()
	r := fetch(url)
	if r.err != nil {
		t.Fatalf("GET %s: %v", url, r.err)
	}
	return r.code
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// waitFor polls cond: an eventual condition, not a timing assertion.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func mustQuery(t *testing.T, q string) url.Values {
	t.Helper()
	v, err := url.ParseQuery(q)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
