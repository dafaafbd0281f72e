package readiness

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	testingclock "k8s.io/utils/clock/testing"
)

// TestCheckNeverProbesTheWorkPath: a pod with its own readiness check is
// probed at that check and never at / (which would be one more request
// at a pod held to its containerConcurrency): an HTTP check GETs its
// path on its port with its headers (Host as the request's host) and
// counts 200-399 as ready, a TCP check only connects.
func TestCheckNeverProbesTheWorkPath(t *testing.T) {
	var mu sync.Mutex
	var paths, hosts, tokens []string
	status := http.StatusServiceUnavailable
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		paths, hosts, tokens = append(paths, r.URL.Path), append(hosts, r.Host), append(tokens, r.Header.Get("X-Probe-Token"))
		if r.URL.Path == "/healthz" {
			w.WriteHeader(status)
		}
	}))
	defer srv.Close()
	addr := netip.MustParseAddrPort(srv.Listener.Addr().String())
	// The pod's serving address is another port: the check's port is used.
	serving := netip.AddrPortFrom(addr.Addr(), 1)

	t.Run("http", func(t *testing.T) {
		clk := testingclock.NewFakeClock(t0)
		s := newSink()
		p := New(Options{Sink: s, Clock: clk})
		defer p.Close()
		check := &Check{HTTP: true, Port: addr.Port(), Path: "/healthz", Header: http.Header{"Host": {"hello.local"}, "X-Probe-Token": {"t1"}}}
		p.SetPods(hello, []Pod{{Addr: serving, Check: check}})
		s.next(t) // empty
		waitFor(t, "a probe answered 503", func() bool { return testutil.ToFloat64(p.m.probes.WithLabelValues(resultNotReady)) >= 1 })
		s.none(t)
		mu.Lock()
		status = http.StatusNoContent
		mu.Unlock()
		clk.Step(DefaultPeriod)
		if diff := cmp.Diff([]netip.AddrPort{serving}, s.next(t), addrs); diff != "" {
			t.Errorf("ready set after the check passed (-want +got):\n%s", diff)
		}
		mu.Lock()
		defer mu.Unlock()
		for i := range paths {
			if paths[i] != "/healthz" || hosts[i] != "hello.local" || tokens[i] != "t1" {
				t.Errorf("probe %d: path %q host %q token %q, want /healthz, hello.local, t1", i, paths[i], hosts[i], tokens[i])
			}
		}
	})
	t.Run("tcp", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		accepted := make(chan []byte, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			b := make([]byte, 64)
			n, _ := c.Read(b) // EOF at once: the check sends nothing
			accepted <- b[:n]
		}()
		tcpAddr := netip.MustParseAddrPort(ln.Addr().String())
		s := newSink()
		p := New(Options{Sink: s, Clock: testingclock.NewFakeClock(t0)})
		defer p.Close()
		p.SetPods(hello, []Pod{{Addr: tcpAddr, Check: &Check{Port: tcpAddr.Port()}}})
		s.next(t) // empty
		if diff := cmp.Diff([]netip.AddrPort{tcpAddr}, s.next(t), addrs); diff != "" {
			t.Errorf("ready set after the connection (-want +got):\n%s", diff)
		}
		if got := <-accepted; len(got) != 0 {
			t.Errorf("the TCP check sent %q, want nothing", got)
		}
	})
}
