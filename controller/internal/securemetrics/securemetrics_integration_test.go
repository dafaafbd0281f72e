package securemetrics_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	"github.com/sockscale/sockscale/controller/internal/securemetrics"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
	"github.com/sockscale/sockscale/test/stack"
)

// The controller's metrics server as main builds it, in front of a real
// kube-apiserver that reviews the tokens: no token is 401, a
// ServiceAccount without the chart's metrics-reader ClusterRole 403, one
// bound to it gets the Prometheus text.
func TestIntegrationMetricsAuth(t *testing.T) {
	c := testenv.ControlPlane(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The chart's ClusterRole, as rendered.
	createRenderedMetricsReader(t, ctx, c)

	probe := prometheus.NewCounter(prometheus.CounterOpts{Name: "sockscale_test_metrics_auth_total", Help: "scraped by the test"})
	crmetrics.Registry.MustRegister(probe)
	defer crmetrics.Registry.Unregister(probe)
	probe.Add(3)

	opts, err := securemetrics.Options(securemetrics.Config{BindAddress: "127.0.0.1:0", Secure: true})
	if err != nil {
		t.Fatal(err)
	}
	hc, err := rest.HTTPClientFor(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := metricsserver.NewServer(opts, c.Config, hc)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Start(ctx) }()
	bound, ok := srv.(interface{ GetBindAddr() string })
	if !ok {
		t.Fatalf("%T does not say where it listens", srv)
	}
	var addr string
	testenv.Eventually(t, 10*time.Second, "the metrics server listens", func() (bool, string) {
		addr = bound.GetBindAddr()
		return addr != "", "no address yet"
	})

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "monitoring"}}
	if err := c.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
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
		code        int    // 0: 200 with the Prometheus text
		say         string // in the answer's body
	}{
		{"no token", "", 401, "Unauthorized: send a bearer token"},
		{"a token the API server did not issue", "not-a-token", 401, "Unauthorized: send a bearer token"},
		{"a ServiceAccount without the role", stranger, 403,
			"Forbidden: system:serviceaccount:monitoring:stranger may not get /metrics; bind it to the chart's <release>-metrics-reader ClusterRole"},
		{"the chart's metrics-reader", reader, 0, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got map[string][]stack.Sample
			var err error
			// A new RoleBinding reaches the API server's authorizer
			// within moments; a 403 right after it is retried.
			testenv.Eventually(t, 10*time.Second, "the expected answer", func() (bool, string) {
				got, err = stack.ScrapeSecure(ctx, addr, tt.token)
				var se *stack.StatusError
				if tt.code == 0 {
					return err == nil, errString(err)
				}
				return errors.As(err, &se) && se.Code == tt.code, errString(err)
			})
			if tt.say != "" && !strings.Contains(err.Error(), tt.say) {
				t.Errorf("answer %q does not say %q", err, tt.say)
			}
			if tt.code == 0 {
				if v := stack.Sum(got, "sockscale_test_metrics_auth_total", nil); v != 3 {
					t.Errorf("sockscale_test_metrics_auth_total = %v, want 3 (scrape of %d families)", v, len(got))
				}
			}
		})
	}
	// Headers past controller-runtime's 1 MiB limit: 431 before any
	// review (its server's other limits: 32 s to send headers, 90 s idle).
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the test's self-signed server
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.WriteString(conn, "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 2<<20)+"\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("2 MiB header: %v %v, want 431", resp, err)
	}
	conn.Close()
	// Plain HTTP on the TLS port is refused, not served.
	if _, err := stack.Scrape(ctx, mustAddrPort(t, addr).Addr(), mustAddrPort(t, addr).Port()); err == nil {
		t.Error("plain HTTP scrape of the secure endpoint succeeded")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("metrics server: %v", err)
	}
}

func errString(err error) string {
	if err == nil {
		return "200"
	}
	return err.Error()
}

// createRenderedMetricsReader renders the chart with the pinned helm
// ($HELM) and creates its metrics-reader ClusterRole.
func createRenderedMetricsReader(t *testing.T, ctx context.Context, c *testenv.Cluster) {
	t.Helper()
	h := stack.HelmFromEnv()
	if h == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("HELM is not set (make exports it); CI=true forbids skipping")
		}
		t.Skip("HELM is not set")
	}
	out, err := exec.Command(h, "template", "sockscale", stack.ChartDir(), "--namespace", stack.Namespace,
		"--show-only", "templates/controller-rbac.yaml").Output()
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	for _, doc := range bytes.Split(out, []byte("\n---\n")) {
		var role rbacv1.ClusterRole
		if err := yaml.Unmarshal(doc, &role); err != nil {
			t.Fatal(err)
		}
		if role.Kind == "ClusterRole" && role.Name == stack.MetricsReaderRole {
			if err := c.Client.Create(ctx, &role); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("the chart renders no ClusterRole %s in\n%s", stack.MetricsReaderRole, strings.TrimSpace(string(out)))
}

func mustAddrPort(t *testing.T, s string) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		t.Fatal(err)
	}
	return ap
}
