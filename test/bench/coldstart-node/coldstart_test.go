package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sockscale/sockscale/test/stack"
)

func TestParseFlags(t *testing.T) {
	f, err := parseFlags([]string{"-helm", "/bin/helm"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if f.samples != 30 || f.timeout != time.Minute || f.stableWindow != 6*time.Second || f.grace != time.Second || f.upTimeout != 20*time.Minute {
		t.Errorf("defaults %+v", f)
	}
	if got := installSets(f); strings.Join(got, " ") != "autoscaler.stable-window=6s autoscaler.scale-to-zero-grace-period=1s" {
		t.Errorf("sets %q", got)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-samples", "0"}, "-samples=0"},
		{[]string{"-stable-window", "5s"}, "-stable-window=5s"},
		{[]string{"-stable-window", "6500ms"}, "-stable-window=6.5s"},
		{[]string{"-grace", "500ms"}, "-grace=500ms"},
		{[]string{"-timeout", "0s"}, "-timeout=0s"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		_, err := parseFlags(append([]string{"-helm", "/bin/helm"}, c.args...), io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error naming %q", c.args, err, c.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 30; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{0.5, 15 * time.Millisecond}, {0.95, 29 * time.Millisecond}, {1, 30 * time.Millisecond}, {0.01, time.Millisecond}} {
		if got, ok := percentile(ds, c.p); !ok || got != c.want {
			t.Errorf("p%v of 1..30 ms: %s, want %s", c.p*100, got, c.want)
		}
	}
	if ds[0] != 30*time.Millisecond {
		t.Error("percentile sorted its argument")
	}
	if _, ok := percentile(nil, 0.5); ok {
		t.Error("a percentile of nothing")
	}
}

// at builds a sample whose request went at t0 and whose steps come at the
// given milliseconds (0: not seen).
func at(t0 time.Time, scaled, created, scheduled, sandbox, running, endpoint, ready, answer int, listeningFor time.Duration) sample {
	ms := func(v int) time.Time {
		if v == 0 {
			return time.Time{}
		}
		return t0.Add(time.Duration(v) * time.Millisecond)
	}
	return sample{start: t0, end: ms(answer), code: http.StatusOK, listeningFor: listeningFor,
		steps: stack.ColdStartSteps{Scaled: ms(scaled), Created: ms(created), Scheduled: ms(scheduled), Sandbox: ms(sandbox), Running: ms(running), Endpoint: ms(endpoint), Ready: ms(ready), Pod: "p"}}
}

func TestStepsAndDominates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r := &result{t: &target{kind: "real", node: "real-a"}}
	// A real node's shape: the container's status is written after the
	// app already answered (it is seen after the first answer).
	for i := range 5 {
		r.samples = append(r.samples, at(t0, 40, 60, 70+i, 600, 900, 650, 1300, 800+i, 15*time.Millisecond))
	}
	r.samples = append(r.samples, sample{start: t0, end: t0.Add(time.Minute), err: errors.New("timeout")})
	st := r.stats()
	if st.samples != 6 || st.failed != 1 || len(st.e2e) != 5 || st.firstError == nil {
		t.Fatalf("stats %+v", st)
	}
	if got, _ := percentile(st.steps[stListening], 0.5); got != 787*time.Millisecond {
		t.Errorf("app listening p50 %s, want 802 - 15 ms", got)
	}
	// Listening at 785-789 ms, long after the endpoint (650 ms): the whole
	// 15 ms share is the activator's.
	if got, _ := percentile(st.afterEndpoint, 0.5); got != 15*time.Millisecond {
		t.Errorf("share after the endpoint %s, want all of the 15 ms", got)
	}
	late := at(t0, 40, 60, 70, 600, 900, 790, 1300, 800, 50*time.Millisecond)
	if got := (&result{samples: []sample{late}}).stats().afterEndpoint; len(got) != 1 || got[0] != 10*time.Millisecond {
		t.Errorf("endpoint 40 ms after listening: share after it %v, want 10ms (of the 50)", got)
	}
	var got []string
	for _, s := range st.stretches() {
		got = append(got, fmt.Sprintf("%s->%s %s", s.from, s.to, s.d))
	}
	want := []string{"request->scaled (/scale) 40ms", "scaled (/scale)->pod created 20ms", "pod created->scheduled 12ms",
		"scheduled->sandbox ready 528ms", "sandbox ready->endpoint published 50ms", "endpoint published->app listening 137ms",
		"app listening->first answer 15ms", "first answer->container running 98ms"}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("stretches\n%s\nwant\n%s", strings.Join(got, ", "), strings.Join(want, ", "))
	}
	if d := st.dominates(); d != "scheduled -> sandbox ready 528 ms (66 %), then endpoint published -> app listening 137 ms (17 %) of the p50 802 ms" {
		t.Errorf("dominates %q", d)
	}

	var b bytes.Buffer
	sim := &result{t: &target{kind: "simulated", node: "node-a"}, samples: []sample{at(t0, 30, 50, 60, 100, 100, 0, 0, 200, 5*time.Millisecond)}}
	writeTable(&b, &flags{timeout: time.Minute, stableWindow: 6 * time.Second, grace: time.Second}, []*result{sim, r}, "1 2 3", "4 5 6")
	out := b.String()
	for _, want := range []string{"simulated node (node-a)", "real node (real-a)", "stable-window=6s", "failed (not 200)",
		"Ready (kubelet) p50", "- (n 0)", "Dominates on the real node: scheduled -> sandbox ready", "real node: 1 of 6 not answered 200; the first: timeout"} {
		if !strings.Contains(out, want) {
			t.Errorf("table does not contain %q:\n%s", want, out)
		}
	}
}

func TestGet(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("case") {
		case "bad":
			w.Header().Set(listeningForHeader, "soon")
		case "503":
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		default:
			w.Header().Set(listeningForHeader, "12345")
		}
		fmt.Fprintln(w, "pod app-1: did nothing")
	}))
	defer srv.Close()
	ctx := context.Background()
	code, pod, lf, err := get(ctx, srv.Client(), srv.URL+"/")
	if err != nil || code != http.StatusOK || pod != "app-1" || lf != 12345*time.Microsecond {
		t.Errorf("get: %d %q %s %v", code, pod, lf, err)
	}
	if _, _, _, err := get(ctx, srv.Client(), srv.URL+"/?case=bad"); err == nil {
		t.Error("a header that is not microseconds is not an error")
	}
	if code, _, lf, err := get(ctx, srv.Client(), srv.URL+"/?case=503"); err == nil || code != http.StatusServiceUnavailable || lf != -1 {
		t.Errorf("503: %d %s %v, want an error and no listening time", code, lf, err)
	}
}
