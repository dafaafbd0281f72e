package securemetrics_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockscale/sockscale/internal/securemetrics"
	"github.com/sockscale/sockscale/internal/serve"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
	"github.com/sockscale/sockscale/test/stack"
)

// The agent's and the activator's metrics server (Serve's, with their own
// registry) in front of a real kube-apiserver: no token is 401, a token
// the API server did not issue 401, a ServiceAccount without the
// metrics-reader ClusterRole 403, one bound to it gets the Prometheus
// text. Plain HTTP on the port gets no metrics.
func TestIntegrationServe(t *testing.T) {
	c := testenv.ControlPlane(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The chart's <release>-metrics-reader (test/chart checks the rendered
	// one, and the controller's test creates it from the chart).
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: stack.MetricsReaderRole},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}
	if err := c.Client.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "monitoring"}}); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	probe := prometheus.NewCounter(prometheus.CounterOpts{Name: "sockscale_test_scrapes_total", Help: "scraped by the test"})
	reg.MustRegister(probe)
	probe.Add(2)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := securemetrics.Config{BindAddress: ln.Addr().String(), Secure: true}
	srv, err := securemetrics.NewServer(cfg, c.Config, mux, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if srv.TLSConfig == nil || srv.TLSNextProto == nil {
		t.Fatalf("server: TLS %v, HTTP/2 off %v; want both", srv.TLSConfig != nil, srv.TLSNextProto != nil)
	}
	done := make(chan error, 1)
	go func() { done <- serve.On(ctx, ln, srv) }()
	addr := ln.Addr().String()

	stranger, err := stack.ServiceAccountToken(ctx, c.Client, "monitoring", "stranger")
	if err != nil {
		t.Fatal(err)
	}
	reader, err := stack.MetricsReaderToken(ctx, c.Client, "monitoring", "prometheus")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, token string
		code        int // 0: 200 with the Prometheus text
	}{
		{"no token", "", 401},
		{"a token the API server did not issue", "not-a-token", 401},
		{"a ServiceAccount without the role", stranger, 403},
		{"the chart's metrics-reader", reader, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got map[string][]stack.Sample
			// A new ClusterRoleBinding reaches the API server's
			// authorizer within moments; a 403 right after it is retried.
			testenv.Eventually(t, 10*time.Second, "the expected answer", func() (bool, string) {
				got, err = stack.ScrapeSecure(ctx, addr, tt.token)
				if tt.code == 0 {
					return err == nil, errString(err)
				}
				var se *stack.StatusError
				return errors.As(err, &se) && se.Code == tt.code, errString(err)
			})
			if tt.code == 0 {
				if v := stack.Sum(got, "sockscale_test_scrapes_total", nil); v != 2 {
					t.Errorf("sockscale_test_scrapes_total = %v, want 2", v)
				}
			}
		})
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stack.Scrape(ctx, ap.Addr(), ap.Port()); err == nil {
		t.Error("plain HTTP scrape of the secure endpoint succeeded")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func errString(err error) string {
	if err == nil {
		return "no error"
	}
	return err.Error()
}
