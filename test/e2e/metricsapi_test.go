package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/kedacore/keda/v2/pkg/scalers/externalscaler"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/metrics/pkg/apis/custom_metrics/v1beta2"
	externalv1beta1 "k8s.io/metrics/pkg/apis/external_metrics/v1beta1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// The chart's sets of this package turn the metrics APIs and KEDA's
// scaler on (chartSets), with a window short enough for a test.
const metricsWindow = 10 * time.Second

// TestE2EMetricsAPIs: a plain Deployment that sockscale does not autoscale
// (what a user's own HPA or KEDA scales) under a steady closed loop of 4
// requests of 250 ms: the custom metrics API gives its pod's concurrency
// and rps, the external metrics API the Deployment's, and KEDA's external
// scaler the same, all equal to what the load did; whoever lacks RBAC (or
// KEDA's client certificate) is refused, and a selector that names no
// Deployment gets an error that says what to write.
func TestE2EMetricsAPIs(t *testing.T) {
	s := up(t)
	t.Parallel() // with the package's other HPA and KEDA scenarios, after the rest: each has its own apps
	ctx := context.Background()
	const name = "metrics-plain"
	app := stack.App{Namespace: appNS, Name: name, Plain: true}
	appURL := e2etest.DeployApp(t, s, app, func(u string) error {
		if a := get(oneShotClient(5*time.Second), u); a.err != nil || a.code != http.StatusOK {
			return fmt.Errorf("GET %s: %s", u, a)
		}
		return nil
	})
	t.Cleanup(func() { _ = s.Remove(context.Background(), app) })
	var pods corev1.PodList
	if err := s.Client.List(ctx, &pods, client.InNamespace(appNS), client.MatchingLabels{"app": name}); err != nil || len(pods.Items) != 1 {
		t.Fatalf("pods of %s: %d, %v", name, len(pods.Items), err)
	}
	pod := pods.Items[0].Name

	// A whole window of steady load, then read while it goes on.
	const offered, sleep = 4, 250 * time.Millisecond
	load := loadgen.Start(ctx, loadgen.Options{URLs: []string{fmt.Sprintf("%s?sleep=%d", appURL, sleep.Milliseconds())}, Concurrency: offered, KeepAlive: true})
	defer load.Stop()
	time.Sleep(metricsWindow + 3*time.Second)

	admin, err := rest.HTTPClientFor(shared.Config)
	if err != nil {
		t.Fatal(err)
	}
	wantRPS := offered / sleep.Seconds() // 16/s, less the little time between requests
	within := func(what string, got, want, tolerance float64) error {
		if math.Abs(got-want) > tolerance*want {
			return fmt.Errorf("%s = %.3f, want %.3f ± %.0f %%", what, got, want, tolerance*100)
		}
		return nil
	}

	podsPath := "/apis/custom.metrics.k8s.io/v1beta2/namespaces/" + appNS + "/pods/*/"
	selector := "?labelSelector=" + url.QueryEscape("app="+name)
	e2etest.Eventually(t, 20*time.Second, "the pod's concurrency and rps through custom.metrics.k8s.io", func() error {
		for _, m := range []struct {
			metric    string
			want, tol float64
		}{{"concurrency", offered, 0.05}, {"rps", wantRPS, 0.10}} {
			var list v1beta2.MetricValueList
			if code, err := getJSON(ctx, admin, podsPath+m.metric+selector, &list); err != nil {
				return fmt.Errorf("HTTP %d: %w", code, err)
			}
			if len(list.Items) != 1 || list.Items[0].DescribedObject.Name != pod {
				return fmt.Errorf("%s: %d items %+v, want pod %s's alone", m.metric, len(list.Items), list.Items, pod)
			}
			if err := within(pod+" "+m.metric, list.Items[0].Value.AsApproximateFloat64(), m.want, m.tol); err != nil {
				return err
			}
		}
		return nil
	})
	externalPath := "/apis/external.metrics.k8s.io/v1beta1/namespaces/" + appNS + "/"
	deployment := "?labelSelector=" + url.QueryEscape("deployment="+name)
	e2etest.Eventually(t, 20*time.Second, "the Deployment's concurrency through external.metrics.k8s.io", func() error {
		var list externalv1beta1.ExternalMetricValueList
		if code, err := getJSON(ctx, admin, externalPath+"concurrency"+deployment, &list); err != nil {
			return fmt.Errorf("HTTP %d: %w", code, err)
		}
		if len(list.Items) != 1 {
			return fmt.Errorf("%d items, want 1: %+v", len(list.Items), list.Items)
		}
		return within(name+" concurrency", list.Items[0].Value.AsApproximateFloat64(), offered, 0.05)
	})

	// A selector that does not name one Deployment: 400, saying what to write.
	code, body := getRaw(ctx, admin, externalPath+"concurrency?labelSelector="+url.QueryEscape("app="+name))
	if code != http.StatusBadRequest || !strings.Contains(body, "deployment=") {
		t.Errorf("selector app=%s: HTTP %d %q, want 400 naming deployment=<name>", name, code, body)
	}

	// RBAC: a ServiceAccount with no role is refused; one that may view
	// the namespace reads its metrics and no other namespace's.
	const reader = "metrics-api-reader"
	token, err := stack.ServiceAccountToken(ctx, s.Client, appNS, reader)
	if err != nil {
		t.Fatal(err)
	}
	asReader := rest.AnonymousClientConfig(shared.Config)
	asReader.BearerToken = token
	readerClient, err := rest.HTTPClientFor(asReader)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{podsPath + "concurrency" + selector, externalPath + "concurrency" + deployment} {
		if code, body := getRaw(ctx, readerClient, path); code != http.StatusForbidden {
			t.Errorf("GET %s without RBAC: HTTP %d %q, want 403", path, code, body)
		}
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: reader},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: appNS, Name: reader}},
	}
	if err := s.Client.Create(ctx, binding); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Client.Delete(context.Background(), binding) })
	e2etest.Eventually(t, 20*time.Second, "a namespace viewer reads its namespace's metrics", func() error {
		for _, path := range []string{podsPath + "concurrency" + selector, externalPath + "concurrency" + deployment} {
			if code, body := getRaw(ctx, readerClient, path); code != http.StatusOK {
				return fmt.Errorf("GET %s as a viewer of %s: HTTP %d %q", path, appNS, code, body)
			}
		}
		return nil
	})
	other := "/apis/external.metrics.k8s.io/v1beta1/namespaces/default/concurrency" + deployment
	if code, body := getRaw(ctx, readerClient, other); code != http.StatusForbidden {
		t.Errorf("GET %s as a viewer of %s only: HTTP %d %q, want 403", other, appNS, code, body)
	}

	kedaScalerAnswers(t, s, name, offered)

	// The user's own HPA, as its docs write one, on the pods' concurrency:
	// 4 in flight at 2 per pod is 2 pods, which then hold at 2 each.
	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: name},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: name},
			MinReplicas:    ptr.To(int32(1)),
			MaxReplicas:    4,
			Metrics: []autoscalingv2.MetricSpec{{Type: autoscalingv2.PodsMetricSourceType, Pods: &autoscalingv2.PodsMetricSource{
				Metric: autoscalingv2.MetricIdentifier{Name: "concurrency"},
				Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: ptr.To(resource.MustParse("2"))},
			}}},
		},
	}
	if err := s.Client.Create(ctx, hpa); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Client.Delete(context.Background(), hpa) })
	hpaCount(t, s, name, 2, 2*time.Minute, "a plain Deployment's own HPA at 4 in flight, 2 per pod")
	if r := load.Stop(); r.Failed > 0 {
		t.Errorf("%d of %d requests failed", r.Failed, r.Completed+r.Failed)
	}
}

// kedaScalerAnswers asks the controller's KEDA scaler, as KEDA's operator
// would with the chart's client certificate, for the Deployment name's
// metric, and checks that a client without that certificate is refused.
func kedaScalerAnswers(t *testing.T, s *stack.Stack, name string, offered float64) {
	t.Helper()
	ctx := context.Background()
	const svcName = "sockscale-controller-keda"
	var secret corev1.Secret
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: stack.Namespace, Name: svcName + "-client"}, &secret); err != nil {
		t.Fatal(err)
	}
	var svc corev1.Service
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: stack.Namespace, Name: svcName}, &svc); err != nil {
		t.Fatal(err)
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil || !s.ServiceCIDR.Contains(ip) {
		t.Fatalf("Service %s: ClusterIP %q outside %s", svcName, svc.Spec.ClusterIP, s.ServiceCIDR)
	}
	addr := netip.AddrPortFrom(ip, uint16(svc.Spec.Ports[0].Port)).String()
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(secret.Data["ca.crt"]) {
		t.Fatal("the client Secret has no ca.crt")
	}
	cert, err := tls.X509KeyPair(secret.Data["tls.crt"], secret.Data["tls.key"])
	if err != nil {
		t.Fatal(err)
	}
	serverName := svcName + "." + stack.Namespace + ".svc"
	dial := func(certs []tls.Certificate) externalscaler.ExternalScalerClient {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs: roots, Certificates: certs, ServerName: serverName, MinVersion: tls.VersionTLS12})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return externalscaler.NewExternalScalerClient(conn)
	}
	keda := dial([]tls.Certificate{cert})
	ref := &externalscaler.ScaledObjectRef{Name: "so-" + name, Namespace: appNS, ScalerMetadata: map[string]string{"deployment": name, "target": "2"}}
	e2etest.Eventually(t, 20*time.Second, "KEDA's scaler gives the Deployment's concurrency", func() error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		spec, err := keda.GetMetricSpec(cctx, ref)
		if err != nil {
			return err
		}
		if len(spec.MetricSpecs) != 1 || spec.MetricSpecs[0].TargetSizeFloat != 2 {
			return fmt.Errorf("metric spec %+v, want one with target 2", spec.MetricSpecs)
		}
		m, err := keda.GetMetrics(cctx, &externalscaler.GetMetricsRequest{ScaledObjectRef: ref, MetricName: spec.MetricSpecs[0].MetricName})
		if err != nil {
			return err
		}
		if len(m.MetricValues) != 1 || math.Abs(m.MetricValues[0].MetricValueFloat-offered) > 0.05*offered {
			return fmt.Errorf("metric values %+v, want one of %v ± 5 %%", m.MetricValues, offered)
		}
		active, err := keda.IsActive(cctx, ref)
		if err != nil {
			return err
		}
		if !active.Result {
			return fmt.Errorf("IsActive false under load")
		}
		return nil
	})
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := dial(nil).IsActive(cctx, ref); err == nil {
		t.Errorf("a client without KEDA's certificate was answered")
	}
}

// getJSON GETs path from the API server into v; an answer other than 200
// is an error carrying its body.
func getJSON(ctx context.Context, c *http.Client, path string, v any) (int, error) {
	code, body := getRaw(ctx, c, path)
	if code != http.StatusOK {
		return code, fmt.Errorf("GET %s: %s", path, body)
	}
	return code, json.Unmarshal([]byte(body), v)
}

// getRaw GETs path from the API server (the kubeconfig's host) with c.
func getRaw(ctx context.Context, c *http.Client, path string) (int, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(shared.Config.Host, "/")+path, nil)
	if err != nil {
		return 0, err.Error()
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, string(b)
}
