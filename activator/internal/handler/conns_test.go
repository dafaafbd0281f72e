package handler

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sockscale/sockscale/activator/internal/target"
)

// moved reads sockscale_activator_connections_moved_total{namespace, how}.
func moved(t *testing.T, reg *prometheus.Registry, namespace, how string) float64 {
	t.Helper()
	return counter(t, reg, "sockscale_activator_connections_moved_total", map[string]string{"namespace": namespace, "how": how})
}

// counter reads the counter name{labels} (0 if it has no such series).
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// closedWithin says whether the server closes c within d (EOF or reset),
// false if c is still open when d is over.
func closedWithin(t *testing.T, c net.Conn, r io.Reader, d time.Duration) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := r.Read(make([]byte, 1))
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return false
	case err == nil:
		t.Fatalf("the server sent bytes nobody asked for")
	}
	return true
}

// TestIdleHTTP1ConnectionsMoved: an idle kept-alive HTTP/1.1 connection
// that carried a request for a target is kept while the target is in
// Proxy mode, and closed once it is in Serve mode; a connection that
// carried no request yet is left alone.
func TestIdleHTTP1ConnectionsMoved(t *testing.T) {
	e := newReconnectEnv(t, 0)
	e.serve(t, target.Target{Key: hello, Proxy: true}, newPod(t, hi).Server)
	used, err := net.Dial("tcp", e.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer used.Close()
	br := bufio.NewReader(used)
	if _, err := io.WriteString(used, "GET / HTTP/1.1\r\nHost: hello.default\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("in Proxy mode: %d, close %v; want 200, kept", resp.StatusCode, resp.Close)
	}
	fresh, err := net.Dial("tcp", e.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()

	if closedWithin(t, used, br, 3*sweepEvery) {
		t.Fatal("the idle connection was closed while its target was in Proxy mode")
	}
	e.setMode(t, false, true)
	if !closedWithin(t, used, br, 6*sweepEvery) {
		t.Errorf("the idle connection is still open %v after its target went to Serve mode", 6*sweepEvery)
	}
	if closedWithin(t, fresh, fresh, time.Millisecond) {
		t.Errorf("a connection that carried no request was closed")
	}
	if got := moved(t, e.reg, "default", "closed"); got != 1 {
		t.Errorf("connections_moved_total{how=closed} = %v, want 1", got)
	}
}

// TestIdleH2CConnectionsGoAway: an idle h2c connection whose last stream
// was for a target now in Serve mode is sent GOAWAY (NO_ERROR, its last
// stream named) and closed; a stream the client opens after it is not
// processed.
func TestIdleH2CConnectionsGoAway(t *testing.T) {
	e := newReconnectEnv(t, 0)
	p := newPod(t, hi)
	e.serve(t, target.Target{Key: hello, Proxy: true}, p.Server)
	c, err := net.Dial("tcp", e.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fr := http2.NewFramer(c, c)
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	get := func(stream uint32) {
		t.Helper()
		var block bytes.Buffer
		enc := hpack.NewEncoder(&block)
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", "hello.default"}, {":path", "/"}} {
			_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: block.Bytes(), EndStream: true, EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
	}
	get(1)
	// Read until stream 1 ends, acknowledging the server's settings.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for done := false; !done; {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading stream 1's answer: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.DataFrame:
			done = f.StreamID == 1 && f.StreamEnded()
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY while the target is in Proxy mode")
		}
	}

	e.setMode(t, false, true)
	_ = c.SetReadDeadline(time.Now().Add(6 * sweepEvery))
	var goAway *http2.GoAwayFrame
	for goAway == nil {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no GOAWAY %v after the target went to Serve mode: %v", 6*sweepEvery, err)
		}
		goAway, _ = f.(*http2.GoAwayFrame)
	}
	if goAway.ErrCode != http2.ErrCodeNo || goAway.LastStreamID != 1 {
		t.Errorf("GOAWAY %v, last stream %d; want NO_ERROR, last stream 1", goAway.ErrCode, goAway.LastStreamID)
	}
	hits := p.hits.Load()
	get(3) // after the GOAWAY: refused unprocessed
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			break // closed
		}
		if h, ok := f.(*http2.HeadersFrame); ok && h.StreamID == 3 {
			t.Errorf("stream 3, opened after the GOAWAY, was answered")
		}
	}
	if got := p.hits.Load(); got != hits {
		t.Errorf("the pod got %d requests after the GOAWAY, want none", got-hits)
	}
	if got := moved(t, e.reg, "default", "goaway"); got != 1 {
		t.Errorf("connections_moved_total{how=goaway} = %v, want 1", got)
	}
}

// The frame cursor finds the HTTP/2 preface and the frame boundaries
// however the bytes are cut, and leaves HTTP/1 alone.
func TestFrameCursor(t *testing.T) {
	var stream bytes.Buffer
	stream.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&stream, nil)
	_ = fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
	_ = fr.WriteData(1, false, bytes.Repeat([]byte("x"), 300))
	_ = fr.WritePing(false, [8]byte{})
	all := stream.Bytes()
	// Boundaries: after the preface, and after each frame.
	bounds := map[int]bool{24: true, 24 + 9 + 6: true, 24 + 15 + 9 + 300: true, len(all): true}
	for _, cut := range []int{1, 2, 7, 9, 10, 64, len(all)} {
		var f frameCursor
		for i := 0; i < len(all); i += cut {
			f.advance(all[i:min(i+cut, len(all))])
			end := min(i+cut, len(all))
			if got := f.atBoundary(); got != bounds[end] {
				t.Errorf("cut %d: after %d bytes atBoundary = %v, want %v", cut, end, got, bounds[end])
			}
		}
	}
	var f frameCursor
	f.advance([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	if f.isH2 || f.atBoundary() {
		t.Errorf("HTTP/1.1 read as HTTP/2")
	}
}
