package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const (
	testV1 = "web-00001"
	testV2 = "web-00002"
)

// answeredBy is a connection started at offset from t0 and answered by a
// pod of rev ("" for a failed one).
func answeredBy(t0 time.Time, offset time.Duration, rev string) conn {
	c := conn{At: t0.Add(offset)}
	if rev == "" {
		c.Err = "503 Service Unavailable"
		return c
	}
	c.Pod = rev + "-deployment-7d9f-abcde"
	return c
}

func TestConnRevision(t *testing.T) {
	for pod, want := range map[string]string{
		"web-00002-deployment-5c6b7-x2x9z": "web-00002",
		"hello-6d9f8-abcde":                "", // not a Revision's pod
		"":                                 "",
	} {
		if got := (conn{Pod: pod}).revision(); got != want {
			t.Errorf("revision of pod %q = %q, want %q", pod, got, want)
		}
	}
}

// Connections are counted in the second they started, by who answered.
func TestBin(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 1, 0, 0, 0, time.UTC)
	conns := []conn{
		answeredBy(t0, -1500*time.Millisecond, testV1), // second -2
		answeredBy(t0, -1*time.Millisecond, testV1),    // second -1
		answeredBy(t0, 0, testV1),                      // second 0, starts it
		answeredBy(t0, 999*time.Millisecond, testV2),   // second 0
		answeredBy(t0, 1200*time.Millisecond, ""),      // second 1, failed
		{At: t0.Add(1300 * time.Millisecond), Pod: "hello-6d9f8-abcde"},
		answeredBy(t0, 2*time.Second, testV2), // second 2: outside [-1, 2)
	}
	got := bin(conns, t0, testV1, testV2, -1, 2)
	want := []second{
		{At: -time.Second, V1: 1},
		{At: 0, V1: 1, V2: 1},
		{At: time.Second, Failed: 1, Other: 1},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("bin (-want +got):\n%s", diff)
	}
}

// A window's scheduled share is the percent in effect when each of its
// connections started, averaged; failures and strangers are not counted.
func TestWindows(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 1, 0, 0, 0, time.UTC)
	steps := []splitStep{{At: -30 * time.Second, V1: 100}, {At: 5 * time.Second, V1: 80, V2: 20}, {At: 15 * time.Second, V2: 100}}
	var conns []conn
	// 0-10 s: 10 connections under 0 % (0-5 s), 10 under 20 % (5-10 s), 4 of these to v2.
	for i := range 20 {
		rev := testV1
		if i >= 10 && i < 14 {
			rev = testV2
		}
		conns = append(conns, answeredBy(t0, time.Duration(i)*500*time.Millisecond, rev))
	}
	conns = append(conns, answeredBy(t0, 3*time.Second, ""), conn{At: t0.Add(4 * time.Second), Pod: "other-pod"})
	// 10-20 s: 2 under 20 %, 2 under 100 %, all to v2.
	for _, s := range []time.Duration{11, 12, 16, 17} {
		conns = append(conns, answeredBy(t0, s*time.Second, testV2))
	}
	got := windows(steps, conns, t0, testV1, testV2, 10*time.Second, 0, 25*time.Second)
	want := []window{
		{From: 0, To: 10 * time.Second, Scheduled: 10, Measured: 20, N: 20},
		{From: 10 * time.Second, To: 20 * time.Second, Scheduled: 60, Measured: 100, N: 4},
		// 20-25 s has no connection: left out.
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("windows (-want +got):\n%s", diff)
	}
}

func TestRolloutLine(t *testing.T) {
	steps := []splitStep{{At: -30 * time.Second, V1: 100, Ready: "True"}, {At: 4200 * time.Millisecond, V1: 99, V2: 1, Ready: "Unknown RolloutInProgress"}}
	for _, tc := range []struct {
		s    second
		want string
	}{
		{second{At: 2 * time.Second, V1: 40}, "    2s            100/0           100/0     40       0         3/1  True\n"},
		// The split changed during the second: its end's, starred.
		{second{At: 4 * time.Second, V1: 38, V2: 1, Failed: 1}, "    4s            99/1*            97/3     40       1         3/1  Unknown RolloutInProgress\n"},
		{second{At: -20 * time.Second, Failed: 2}, "  -20s            100/0               -      2       2         3/1  True\n"},
		{second{At: -50 * time.Second}, "  -50s                -               -      0       0         3/1  -\n"},
	} {
		if got := rolloutLine(tc.s, steps, podsAt{V1: 3, V2: 1}); got != tc.want {
			t.Errorf("rolloutLine(%+v) =\n%q, want\n%q", tc.s, got, tc.want)
		}
	}
}

// testRecord: v1 alone, then the rollout's 1 % at 4.5 s, 50 % at 10 s and
// 100 % at 30 s; a Ready change that keeps the split at 2 s.
func testRecord() *rolloutRecord {
	return &rolloutRecord{
		V1: testV1, V2: testV2,
		Steps: []splitStep{
			{At: -40 * time.Second, V1: 100, Ready: "True"},
			{At: 2 * time.Second, V1: 100, Ready: "Unknown RolloutInProgress"},
			{At: 4500 * time.Millisecond, V1: 99, V2: 1},
			{At: 10 * time.Second, V1: 50, V2: 50},
			{At: 30 * time.Second, V2: 100, Ready: "True"},
		},
		Seconds: []second{{At: -2 * time.Second, V1: 20}, {At: -time.Second, Failed: 3}, {At: 5 * time.Second, V1: 15, V2: 5}, {At: 31 * time.Second, V2: 19, Failed: 1}},
		Pods: []podsAt{
			{At: -1200 * time.Millisecond, V1: 3}, {At: 5800 * time.Millisecond, V1: 3, V2: 1},
			{At: 6800 * time.Millisecond, V1: 3, V2: 1}, {At: 31800 * time.Millisecond, V1: 1, V2: 4},
		},
		Markers: []Marker{{At: -50 * time.Second, Label: "before the span"}, {At: 0, Label: "template changed"}, {At: 30 * time.Second, Label: "100 % " + testV2}},
		End:     35 * time.Second,
	}
}

// The drawing data: the schedule as a step line from the span's start,
// a dot per second with answers at its middle, pods as step lines.
func TestDrawRollout(t *testing.T) {
	s := func(sec float64) time.Duration { return time.Duration(sec * float64(time.Second)) }
	got := drawRollout(testRecord())
	want := rolloutDrawing{
		From: s(-2), To: s(35),
		Scheduled: []point{{s(-2), 0}, {s(4.5), 0}, {s(4.5), 1}, {s(10), 1}, {s(10), 50}, {s(30), 50}, {s(30), 100}, {s(35), 100}},
		Measured:  []point{{s(-1.5), 0}, {s(5.5), 25}, {s(31.5), 100}}, // second -1: no answer, no dot
		PodsV1:    []point{{s(-1.2), 3}, {s(31.8), 3}, {s(31.8), 1}, {s(35), 1}},
		PodsV2:    []point{{s(-1.2), 0}, {s(5.8), 0}, {s(5.8), 1}, {s(31.8), 1}, {s(31.8), 4}, {s(35), 4}},
		MaxPods:   4,
		Markers:   []Marker{{At: 0, Label: "template changed"}, {At: s(30), Label: "100 % " + testV2}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("drawRollout (-want +got):\n%s", diff)
	}
	if got := drawRollout(&rolloutRecord{V1: testV1, V2: testV2}); got.To > got.From || len(got.Scheduled) > 0 {
		t.Errorf("drawRollout of nothing = %+v, want an empty drawing", got)
	}
}

func TestStepCorners(t *testing.T) {
	for _, tc := range []struct {
		name     string
		changes  []point
		from, to time.Duration
		want     []point
	}{
		{"none", nil, 0, 10, nil},
		{"starts in the span", []point{{2, 1}, {5, 3}}, 0, 10, []point{{2, 1}, {5, 1}, {5, 3}, {10, 3}}},
		{"replaced before the span", []point{{-9, 7}, {-5, 1}, {5, 3}}, 0, 10, []point{{0, 1}, {5, 1}, {5, 3}, {10, 3}}},
		{"changes after the span", []point{{0, 1}, {12, 3}}, 0, 10, []point{{0, 1}, {10, 1}}},
		{"ends on the last change", []point{{0, 1}, {10, 3}}, 0, 10, []point{{0, 1}, {10, 1}, {10, 3}}},
	} {
		if diff := cmp.Diff(tc.want, stepCorners(tc.changes, tc.from, tc.to)); diff != "" {
			t.Errorf("%s: stepCorners (-want +got):\n%s", tc.name, diff)
		}
	}
}

// TestWriteRolloutPNG draws testRecord and checks where its marks land.
func TestWriteRolloutPNG(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteRolloutPNG(&buf, "test", testRecord()); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != plotW || b.Dy() != plotH {
		t.Fatalf("size %v, want %dx%d", b, plotW, plotH)
	}
	same := func(x, y int, want any) bool {
		r, g, b, _ := img.At(x, y).RGBA()
		wr, wg, wb, _ := want.(interface{ RGBA() (r, g, b, a uint32) }).RGBA()
		return r == wr && g == wg && b == wb
	}
	// The span is -2 s to 35 s.
	x := func(sec float64) int { return marginL + int(float64(plotW-marginL-marginR)*(sec+2)/37) }
	for _, c := range []struct {
		what string
		x, y int
		want any
	}{
		// 50 % from 10 s to 30 s: half the upper panel.
		{"scheduled 50 % at 20 s", x(20), topY + panelH/2, colScheduled},
		{"scheduled 100 % at 33 s", x(33), topY, colScheduled},
		// Second 5: 5 of 20 answers by v2, a dot at 25 %.
		{"measured 25 % at 5.5 s", x(5.5), topY + panelH*3/4, colMeasured},
		{"measured 25 %, the dot's corner", x(5.5) + dotSize/2, topY + panelH*3/4 + dotSize/2, colMeasured},
		// Pods on an axis up to 4: v1 at 3, v2 at 1.
		{"v1 at 3 pods at 20 s", x(20), bottomY + panelH/4, colPodsV1},
		{"v2 at 1 pod at 20 s", x(20), bottomY + panelH*3/4, colPodsV2},
		{"v2 at 4 pods at 34 s", x(34), bottomY, colPodsV2},
		// The template change: a dashed line through both panels.
		{"marker in the upper panel", x(0), topY + 2, colMarker},
		{"marker in the lower panel", x(0), bottomY + 2, colMarker},
	} {
		if !same(c.x, c.y, c.want) {
			t.Errorf("%s: (%d,%d) is %v, want %v", c.what, c.x, c.y, img.At(c.x, c.y), c.want)
		}
	}
	// Nothing measured: still a PNG, saying so.
	buf.Reset()
	if err := WriteRolloutPNG(&buf, "test", &rolloutRecord{V1: testV1, V2: testV2}); err != nil {
		t.Fatal(err)
	}
	if _, err := png.Decode(&buf); err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
}

// TestRunClient runs the in-node client's loop against a local server (no
// namespace: its connects are not rewritten) and reads its output as the
// demo does.
func TestRunClient(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RawQuery == "fail=1" {
			http.Error(w, "no", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "pod %s-deployment-abc-xyz: did nothing (%s)\n", testV2, r.URL.RawQuery)
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	addr := netip.MustParseAddrPort(ln.Addr().String())

	for _, tc := range []struct {
		path    string
		wantPod string
		wantErr string
	}{{"/?sleep=1", testV2 + "-deployment-abc-xyz", ""}, {"/?fail=1", "", "503 Service Unavailable"}} {
		cfg, _ := json.Marshal(clientConfig{Addr: addr, Path: tc.path, Every: 20 * time.Millisecond, Timeout: 5 * time.Second})
		in, stop := io.Pipe()
		var out bytes.Buffer
		done := make(chan error, 1)
		go func() { done <- runClient(string(cfg), in, &out) }()
		time.Sleep(150 * time.Millisecond)
		stop.Close()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(&out)
		if !sc.Scan() || sc.Text() != clientRunning {
			t.Fatalf("the client's first line is not %q: %q", clientRunning, out.String())
		}
		var n int
		for sc.Scan() {
			var c conn
			rest, ok := strings.CutPrefix(sc.Text(), clientConn)
			if !ok || json.Unmarshal([]byte(rest), &c) != nil {
				t.Fatalf("not a connection line: %q", sc.Text())
			}
			n++
			if c.Pod != tc.wantPod || !strings.Contains(c.Err, tc.wantErr) || (tc.wantErr == "" && c.Err != "") {
				t.Errorf("%s: pod %q, error %q; want pod %q, error containing %q", tc.path, c.Pod, c.Err, tc.wantPod, tc.wantErr)
			}
			if c.Dest != addr {
				t.Errorf("%s: destination %s, want the address dialled %s (nothing rewrites it here)", tc.path, c.Dest, addr)
			}
		}
		// 150 ms at a connection every 20 ms: about 8.
		if n < 3 {
			t.Errorf("%s: %d connections in 150 ms at one every 20 ms", tc.path, n)
		}
	}
}

func TestStepsLine(t *testing.T) {
	short := []splitStep{{At: -20200 * time.Millisecond, V1: 100}, {At: 1400 * time.Millisecond, V1: 99, V2: 1}, {At: 1500 * time.Millisecond, V1: 99, V2: 1, Ready: "Unknown"}}
	long := []splitStep{{At: -20200 * time.Millisecond, V1: 100}}
	for i, p := range []int64{1, 3, 5, 7, 9, 11, 100} {
		long = append(long, splitStep{At: time.Duration(1400+1000*i) * time.Millisecond, V1: 100 - p, V2: p})
	}
	for _, tc := range []struct {
		steps []splitStep
		want  string
	}{
		{nil, "none seen"},
		{short, "-20.2s 0%, 1.4s 1%"}, // a Ready change is no step
		{long, "-20.2s 0%, 1.4s 1%, 2.4s 3%, 3.4s 5%, ... 6.4s 11%, 7.4s 100% (7 changes, one every 1.0 s on average)"},
	} {
		if got := stepsLine(tc.steps); got != tc.want {
			t.Errorf("stepsLine =\n%q, want\n%q", got, tc.want)
		}
	}
}

func TestRolloutOutDefault(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--helm=helm"}, "out/demo-rollout.png"},
		{[]string{"--helm=helm", "--out=/tmp/x/plot.png"}, "/tmp/x/plot-rollout.png"},
		{[]string{"--helm=helm", "--rollout-out=r.png"}, "r.png"},
	} {
		f, err := parseFlags(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		if f.rolloutOut != tc.want || !f.rollout {
			t.Errorf("parseFlags(%q): rollout %v, rollout-out %q; want true, %q", tc.args, f.rollout, f.rolloutOut, tc.want)
		}
	}
}
