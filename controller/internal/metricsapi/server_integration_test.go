package metricsapi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/controller/internal/recentload"
	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// The server, with its requests reviewed by a real kube-apiserver under
// the roles an extension API server is given (system:auth-delegator and
// extension-apiserver-authentication-reader), answers a ServiceAccount
// RBAC allows to read the metrics with the values recorded, one it does
// not allow 403, and a request without credentials 401.
func TestIntegrationMetricsAPIServer(t *testing.T) {
	testenv.RequireRoot(t)
	cl := testenv.ControlPlane(t)
	ctx := context.Background()

	store, err := recentload.New(clock.RealClock{}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	store.RecordPods("node-a", &stats.Batch{Node: "node-a", Period: time.Second, Pods: []stats.PodStat{{
		IP: netip.MustParseAddr("10.0.0.1"), Namespace: "default", Pod: "hello-1", Workload: "hello", Concurrency: 3, Requests: 30}}})
	pods := &fakePods{}
	pods.add("hello-1", "node-a", "10.0.0.1")
	pods.namespace = "default"

	certFile, keyFile, roots := servingCert(t)
	srv, err := NewServer(ServerOptions{BindAddress: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile,
		Kube: delegatorConfig(t, cl), APIs: CustomMetrics | ExternalMetrics, Provider: NewProvider(store, pods, &fakeDeployments{names: map[string]bool{"default/hello": true}}, clock.RealClock{})})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})

	reader := serviceAccountToken(t, cl.Client, "metrics-reader", []rbacv1.PolicyRule{{
		// What the HorizontalPodAutoscaler controller's ClusterRole has.
		APIGroups: []string{"custom.metrics.k8s.io", "external.metrics.k8s.io"}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}}})
	nobody := serviceAccountToken(t, cl.Client, "nobody", nil)

	base := "https://" + srv.Addr().String()
	custom := base + "/apis/custom.metrics.k8s.io/v1beta2/namespaces/default/pods/*/concurrency"
	external := base + "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/concurrency?labelSelector=deployment%3Dhello"
	httpc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	get := func(url, token string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := httpc.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	testenv.Eventually(t, 20*time.Second, "the metrics API serves", func() (bool, string) {
		code, body := get(custom, reader)
		return code == http.StatusOK, fmt.Sprintf("%d %.300s", code, body)
	})

	code, body := get(custom, reader)
	var podList struct {
		Items []struct {
			DescribedObject struct{ Kind, Namespace, Name string } `json:"describedObject"`
			Metric          struct{ Name string }                  `json:"metric"`
			Value           string                                 `json:"value"`
			WindowSeconds   int64                                  `json:"windowSeconds"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(body), &podList); err != nil || code != http.StatusOK || len(podList.Items) != 1 {
		t.Fatalf("custom metric: %d, %v: %.500s", code, err, body)
	}
	if got := podList.Items[0]; got.DescribedObject.Name != "hello-1" || got.Metric.Name != "concurrency" || got.Value != "3" || got.WindowSeconds != 60 {
		t.Errorf("custom metric item %+v, want hello-1's concurrency 3 over 60 s", got)
	}

	code, body = get(external, reader)
	var externalList struct {
		Items []struct {
			MetricName   string            `json:"metricName"`
			MetricLabels map[string]string `json:"metricLabels"`
			Value        string            `json:"value"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(body), &externalList); err != nil || code != http.StatusOK || len(externalList.Items) != 1 {
		t.Fatalf("external metric: %d, %v: %.500s", code, err, body)
	}
	if got := externalList.Items[0]; got.MetricName != "concurrency" || got.MetricLabels["deployment"] != "hello" || got.Value != "3" {
		t.Errorf("external metric item %+v, want hello's concurrency 3", got)
	}

	code, body = get(base+"/apis/external.metrics.k8s.io/v1beta1/namespaces/default/concurrency?labelSelector=app%3Dhello", reader)
	if code != http.StatusBadRequest || !strings.Contains(body, `metric selector: \"app=hello\" selects on \"app\"`) {
		t.Errorf("external metric with app=hello: %d %.500s; want 400 saying what is wrong", code, body)
	}

	code, body = get(base+"/apis/custom.metrics.k8s.io/v1beta2", reader)
	for _, resource := range []string{`"pods/concurrency"`, `"pods/rps"`} {
		if code != http.StatusOK || !strings.Contains(body, resource) {
			t.Errorf("discovery of custom.metrics.k8s.io/v1beta2: %d %.500s; want %s listed", code, body, resource)
		}
	}

	for _, url := range []string{custom, external} {
		if code, body := get(url, nobody); code != http.StatusForbidden {
			t.Errorf("%s as a ServiceAccount without RBAC: %d %.300s, want 403", url, code, body)
		}
		if code, body := get(url, ""); code != http.StatusUnauthorized {
			t.Errorf("%s without credentials: %d %.300s, want 401", url, code, body)
		}
	}
}

// servingCert writes a self-signed certificate for 127.0.0.1 and its key,
// and returns their files and a pool that trusts it.
func servingCert(t *testing.T) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("localhost", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	roots = x509.NewCertPool()
	if !roots.AppendCertsFromPEM(certPEM) {
		t.Fatal("no certificate in the generated PEM")
	}
	return certFile, keyFile, roots
}

// delegatorConfig is a config of a user bound to what an extension API
// server is given: system:auth-delegator (TokenReviews,
// SubjectAccessReviews) and, in kube-system,
// extension-apiserver-authentication-reader.
func delegatorConfig(t *testing.T, cl *testenv.Cluster) *rest.Config {
	t.Helper()
	const user = "sockscale-metrics-server"
	ctx := context.Background()
	subjects := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
	for _, o := range []client.Object{
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user}, Subjects: subjects,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:auth-delegator"}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: user}, Subjects: subjects,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "extension-apiserver-authentication-reader"}},
	} {
		if err := cl.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	cfg := rest.CopyConfig(cl.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	// The API server's RBAC authorizer learns of new bindings through an
	// informer: wait until it lets the user read the ConfigMap, as the
	// server does first.
	as, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "the metrics server's user may read "+authenticationConfigMapNamespace+"/"+authenticationConfigMapName, func() (bool, string) {
		err := as.Get(ctx, client.ObjectKey{Namespace: authenticationConfigMapNamespace, Name: authenticationConfigMapName}, &corev1.ConfigMap{})
		return err == nil, fmt.Sprint(err)
	})
	return cfg
}

// serviceAccountToken makes a ServiceAccount of default, bound to a
// ClusterRole of rules (none: no binding), and returns a token of it.
func serviceAccountToken(t *testing.T, c client.Client, name string, rules []rbacv1.PolicyRule) string {
	t.Helper()
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	if err := c.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	if rules != nil {
		for _, o := range []client.Object{
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules},
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "default", Name: name}}},
		} {
			if err := c.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	hour := int64(3600)
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hour}}
	if err := c.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatalf("token of ServiceAccount default/%s: %v", name, err)
	}
	return tr.Status.Token
}
