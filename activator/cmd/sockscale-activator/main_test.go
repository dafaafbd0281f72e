package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/activator/internal/holdpool"
	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/activatorprobe"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
	"github.com/sockscale/sockscale/test/stack"
)

func TestFlags(t *testing.T) {
	t.Setenv("POD_NAME", "activator-0")
	tests := []struct {
		name string
		args []string
		errs []string // substrings; none: valid
	}{
		{name: "defaults", args: nil},
		{name: "queue depth 0", args: []string{"--queue-depth=0"}, errs: []string{"--queue-depth=0: must be from 1 to 1000000"}},
		{name: "queue depth too deep", args: []string{"--queue-depth=2000000"}, errs: []string{"--queue-depth=2000000: must be from 1 to 1000000"}},
		{name: "probe period", args: []string{"--probe-period=0s", "--probe-timeout=1m"},
			errs: []string{"--probe-period=0s: must be from 1ms to 10s", "--probe-timeout=1m0s: must be from 1ms to 10s"}},
		{name: "drain delay not below grace", args: []string{"--drain-delay=30s"}, errs: []string{"--drain-delay=30s: must be from 0 to less than --shutdown-grace-period (30s)"}},
		{name: "grace", args: []string{"--shutdown-grace-period=0s", "--drain-delay=0s"}, errs: []string{"--shutdown-grace-period=0s: must be from 1s to 1h"}},
		{name: "address", args: []string{"--proxy-bind-address=8012"}, errs: []string{`--proxy-bind-address="8012": want [host]:port`}},
		{name: "route address", args: []string{"--route-bind-address=8013"}, errs: []string{`--route-bind-address="8013": want [host]:port`}},
		{name: "cluster domain", args: []string{"--cluster-domain="}, errs: []string{`--cluster-domain="": want a DNS domain`}},
		{name: "pod name", args: []string{"--pod-name="}, errs: []string{"--pod-name is empty: set it or $POD_NAME"}},
		{name: "arguments", args: []string{"extra"}, errs: []string{`unexpected arguments ["extra"]`}},
		{name: "stats address", args: []string{"--controller-stats-address=sockscale-controller-stats"},
			errs: []string{`--controller-stats-address="sockscale-controller-stats": want host:port`}},
		{name: "report period", args: []string{"--report-period=10ms"}, errs: []string{"--report-period=10ms: must be from 100ms to 1m"}},
		{name: "max held derived", args: []string{"--max-held=0"}},
		{name: "max held set", args: []string{"--max-held=500"}},
		{name: "max held negative", args: []string{"--max-held=-1"}, errs: []string{"--max-held=-1: must be from 0 (derived from the memory limit) to 1000000"}},
		{name: "max held too many", args: []string{"--max-held=1000001"}, errs: []string{"--max-held=1000001: must be from 0 (derived from the memory limit) to 1000000"}},
		{name: "network policies ignored", args: []string{"--network-policies=ignore"}},
		{name: "network policies", args: []string{"--network-policies=audit"}, errs: []string{`--network-policies="audit": want enforce or ignore`}},
		{name: "stats", args: []string{"--controller-stats-address=ctl.ns.svc:8443", "--report-period=2s"}},
		{name: "reconnect off", args: []string{"--reconnect-served-clients=false"}},
		{name: "reconnect at once", args: []string{"--reconnect-served-after=0s"}},
		{name: "reconnect after", args: []string{"--reconnect-served-after=-1s"}, errs: []string{"--reconnect-served-after=-1s: must be from 0 to 1m"}},
		{name: "reconnect too late", args: []string{"--reconnect-served-after=2m"}, errs: []string{"--reconnect-served-after=2m0s: must be from 0 to 1m"}},
		{name: "plain metrics", args: []string{"--metrics-secure=false"}},
		{name: "metrics certificate without TLS", args: []string{"--metrics-secure=false", "--metrics-cert-path=/etc/certs"},
			errs: []string{`--metrics-cert-path="/etc/certs" needs --metrics-secure`}},
		{name: "metrics certificate missing", args: []string{"--metrics-cert-path=/nonexistent"},
			errs: []string{`--metrics-cert-name="tls.crt" in --metrics-cert-path="/nonexistent"`, `--metrics-cert-key="tls.key" in --metrics-cert-path="/nonexistent"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseFlags(tt.args)
			var got []string
			if err != nil {
				for _, want := range tt.errs {
					if strings.Contains(err.Error(), want) {
						got = append(got, want)
					}
				}
				if len(got) == 0 {
					got = []string{err.Error()}
				}
			}
			if diff := cmp.Diff(tt.errs, got); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
}

// TestResolveMaxHeld derives --max-held=0 from a fake cgroup's memory.max.
func TestResolveMaxHeld(t *testing.T) {
	for _, tc := range []struct {
		name      string
		flag      int
		memoryMax string // "": no file
		want      int
		wantLimit int64
		err       string
	}{
		{name: "flag wins", flag: 500, memoryMax: "268435456\n", want: 500},
		{name: "the chart's 256Mi limit", memoryMax: "268435456\n", want: 1365, wantLimit: 256 << 20},
		{name: "1Gi", memoryMax: "1073741824\n", want: 5461, wantLimit: 1 << 30},
		{name: "no limit", memoryMax: "max\n", want: holdpool.DefaultCapacity},
		{name: "no cgroup v2", want: holdpool.DefaultCapacity},
		{name: "unreadable limit", memoryMax: "lots\n", want: holdpool.DefaultCapacity, err: `derive --max-held: memory limit: `},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.memoryMax != "" {
				if err := os.WriteFile(filepath.Join(dir, "memory.max"), []byte(tc.memoryMax), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			held, limit, err := resolveMaxHeld(tc.flag, dir, filepath.Join(dir, "no-self-cgroup"))
			gotErr := ""
			if err != nil {
				gotErr = err.Error()[:min(len(err.Error()), len(tc.err))]
			}
			type result struct {
				Held  int
				Limit int64
				Err   string
			}
			if diff := cmp.Diff(result{tc.want, tc.wantLimit, tc.err}, result{held, limit, gotErr}); diff != "" {
				t.Errorf("resolveMaxHeld -want +got:\n%s", diff)
			}
		})
	}
}

// TestIntegrationRun starts the binary's run loop against a real
// kube-apiserver, checks that it becomes ready once synced, answers an
// activator probe, refuses an unknown host, holds a request for a target
// with no pod until the target's timeout (504), and that a stop drains
// and returns.
func TestIntegrationRun(t *testing.T) {
	cl := testenv.ControlPlane(t)
	t.Setenv("POD_NAME", "activator-0")
	ctx0, cancel0 := context.WithTimeout(context.Background(), time.Minute)
	defer cancel0()
	timeout := int32(1)
	for _, o := range []client.Object{
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}},
		&v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
			Spec: v1alpha1.PodAutoscalerSpec{
				ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: "hello"},
				Service:        v1alpha1.ServiceRef{Name: "hello", Port: 80}, TimeoutSeconds: &timeout}},
	} {
		if err := cl.Client.Create(ctx0, o); err != nil {
			t.Fatal(err)
		}
	}
	addrs := freeAddrs(t, 4)
	cfg, err := parseFlags([]string{"--proxy-bind-address=" + addrs[0], "--metrics-bind-address=" + addrs[1],
		"--health-probe-bind-address=" + addrs[2], "--route-bind-address=" + addrs[3], "--drain-delay=0s", "--shutdown-grace-period=1s", "--kubeconfig=" + cl.Kubeconfig})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, slog.New(slog.DiscardHandler)) }()

	get := func(url string, hdr ...string) (int, string, http.Header) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			for i := 0; i+1 < len(hdr); i += 2 {
				if hdr[i] == "Host" {
					req.Host = hdr[i+1] // Go sends req.Host, not a Host header
					continue
				}
				req.Header.Set(hdr[i], hdr[i+1])
			}
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				return resp.StatusCode, string(body), resp.Header
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s: %v", url, err)
			}
			time.Sleep(10 * time.Millisecond) // the server is starting
		}
	}
	if code, _, h := get("http://"+addrs[0]+"/", activatorprobe.Header, activatorprobe.Value); code != 200 || h.Get(activatorprobe.ResponseHeader) != "activator-0" {
		t.Errorf("activator probe: %d, %s=%q", code, activatorprobe.ResponseHeader, h.Get(activatorprobe.ResponseHeader))
	}
	if code, body, _ := get("http://" + addrs[0] + "/"); code != 404 || !strings.Contains(body, "is not the ClusterIP of any target") {
		t.Errorf("unknown host: %d %q", code, body)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, body, _ := get("http://" + addrs[2] + "/readyz")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz: %d %q after 30 s", code, body)
		}
	}
	// Synced: the target is known, has no pod, so its request is held
	// until its 1 s timeout.
	start := time.Now()
	if code, body, _ := get("http://"+addrs[0]+"/", "Host", "hello.default.svc"); code != 504 || !strings.Contains(body, "default/hello") {
		t.Errorf("request for a target with no pod: %d %q, want 504 naming default/hello", code, body)
	}
	if held := time.Since(start); held < 900*time.Millisecond {
		t.Errorf("held %v, want about the target's 1 s timeout", held)
	}
	// /metrics is HTTPS (--metrics-secure by default) for the chart's
	// metrics-reader only; /healthz stays plain and open for the kubelet.
	if _, err := stack.ScrapeSecure(ctx0, addrs[1], ""); !isStatus(err, 401) {
		t.Errorf("/metrics without a token: %v, want 401", err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: stack.MetricsReaderRole},
		Rules: []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}}}
	if err := cl.Client.Create(ctx0, role); err != nil {
		t.Fatal(err)
	}
	token, err := stack.MetricsReaderToken(ctx0, cl.Client, "default", "prometheus")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string][]stack.Sample
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		// The new binding reaches the authorizer within moments.
		if m, err = stack.ScrapeSecure(ctx0, addrs[1], token); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if _, ok := m["sockscale_activator_probes_total"]; err != nil || !ok {
		t.Errorf("/metrics with the reader's token: %v, activator series there: %v", err, ok)
	}
	if code, _, _ := get("http://" + addrs[2] + "/healthz"); code != 200 {
		t.Errorf("/healthz without a token: %d, want 200", code)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after stop")
	}
}

func freeAddrs(t *testing.T, n int) []string {
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, ln.Addr().String())
		defer ln.Close()
	}
	return addrs
}

// isStatus: err is a scrape answered with code.
func isStatus(err error, code int) bool {
	var se *stack.StatusError
	return errors.As(err, &se) && se.Code == code
}

func TestReconnectDefaults(t *testing.T) {
	t.Setenv("POD_NAME", "activator-0")
	c, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !c.reconnect || c.reconnectAfter != 2*time.Second {
		t.Errorf("--reconnect-served-clients=%v --reconnect-served-after=%v, want true and 2s", c.reconnect, c.reconnectAfter)
	}
}
