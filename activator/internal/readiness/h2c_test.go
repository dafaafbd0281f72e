package readiness

import (
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testingclock "k8s.io/utils/clock/testing"
)

// grpcPod is a pod whose server speaks HTTP/2 without TLS and nothing
// else: a grpc-go server with the health service, as most gRPC apps are.
func grpcPod(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return netip.MustParseAddrPort(ln.Addr().String())
}

// TestH2CPodReadyByProbe: a gRPC pod the EndpointSlice has not called
// ready yet answers an h2c probe (grpc-go: 415 to a GET, below 500) and
// is ready at once. Probed over HTTP/1.1, as before the target's Service
// port said h2c, it never answers (grpc-go closes the connection), so it
// would wait for its EndpointSlice; once the port says h2c its next
// probe speaks h2c.
func TestH2CPodReadyByProbe(t *testing.T) {
	addr := grpcPod(t)
	t.Run("h2c", func(t *testing.T) {
		s := newSink()
		p := New(Options{Sink: s, Clock: testingclock.NewFakeClock(t0)})
		defer p.Close()
		p.SetPods(hello, []Pod{{Addr: addr, H2C: true}})
		if got := s.next(t); len(got) != 0 {
			t.Fatalf("first set = %v, want empty", got)
		}
		if diff := cmp.Diff([]netip.AddrPort{addr}, s.next(t), addrs); diff != "" {
			t.Errorf("ready set after the first probe (-want +got):\n%s", diff)
		}
		if got := testutil.ToFloat64(p.m.probes.WithLabelValues(resultReady)); got != 1 {
			t.Errorf("ready probes = %v, want 1", got)
		}
	})
	t.Run("HTTP/1.1 then h2c", func(t *testing.T) {
		clk := testingclock.NewFakeClock(t0)
		s := newSink()
		p := New(Options{Sink: s, Clock: clk})
		defer p.Close()
		p.SetPods(hello, []Pod{{Addr: addr}})
		s.next(t) // empty
		waitFor(t, "an HTTP/1.1 probe fails", func() bool { return testutil.ToFloat64(p.m.probes.WithLabelValues(resultError)) >= 1 })
		s.none(t)
		p.SetPods(hello, []Pod{{Addr: addr, H2C: true}})
		s.none(t) // same pods, same (empty) ready set
		clk.Step(DefaultPeriod)
		if diff := cmp.Diff([]netip.AddrPort{addr}, s.next(t), addrs); diff != "" {
			t.Errorf("ready set after an h2c probe (-want +got):\n%s", diff)
		}
	})
}

// TestH2CProbeRequest: the h2c probe is an HTTP/2 request with the
// probes' User-Agent (the agents tell probes from load by it), on a
// connection of its own that is closed after it; its status decides as
// over HTTP/1.1.
func TestH2CProbeRequest(t *testing.T) {
	type seen struct {
		Proto, UserAgent string
	}
	got := make(chan seen, 10)
	var code atomic.Int32
	code.Store(http.StatusOK)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.Proto, r.UserAgent()}
		w.WriteHeader(int(code.Load()))
	})}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetUnencryptedHTTP2(true) // h2c only: no HTTP/1.1
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns connCount
	srv.ConnState = conns.track
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/"

	p := New(Options{Sink: newSink()})
	defer p.Close()
	if p.probe(t.Context(), p.client, url) {
		t.Error("an HTTP/1.1 probe of an h2c-only server: ready, want not")
	}
	if !p.probe(t.Context(), p.h2cClient, url) {
		t.Fatal("an h2c probe answered 200: not ready")
	}
	if diff := cmp.Diff(seen{"HTTP/2.0", UserAgent}, <-got); diff != "" {
		t.Errorf("the probe as the server saw it (-want +got):\n%s", diff)
	}
	waitFor(t, "the probes' connections closed", func() bool { return conns.opened.Load() >= 1 && conns.closed.Load() == conns.opened.Load() })
	code.Store(http.StatusServiceUnavailable)
	if p.probe(t.Context(), p.h2cClient, url) {
		t.Error("an h2c probe answered 503: ready, want not")
	}
}

// connCount counts a server's connections opened and closed.
type connCount struct{ opened, closed atomic.Int64 }

func (c *connCount) track(_ net.Conn, st http.ConnState) {
	switch st {
	case http.StateNew:
		c.opened.Add(1)
	case http.StateClosed, http.StateHijacked:
		c.closed.Add(1)
	}
}

// waitFor polls cond: an eventual condition, not a timing assertion.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
