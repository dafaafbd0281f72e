package stack

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// MetricsReaderRole is the chart's ClusterRole for scrapers of the
// controller's /metrics (release "sockscale").
const MetricsReaderRole = "sockscale-metrics-reader"

// ServiceAccountToken creates the ServiceAccount namespace/name if it is
// missing and returns a token of it from the TokenRequest API, valid for
// an hour: what a pod of that account presents.
func ServiceAccountToken(ctx context.Context, c client.Client, namespace, name string) (string, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if err := c.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("create ServiceAccount %s/%s: %w", namespace, name, err)
	}
	hour := int64(3600)
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &hour}}
	if err := c.SubResource("token").Create(ctx, sa, tr); err != nil {
		return "", fmt.Errorf("token of ServiceAccount %s/%s: %w", namespace, name, err)
	}
	return tr.Status.Token, nil
}

// MetricsReaderToken is a token of the ServiceAccount namespace/name bound
// to MetricsReaderRole, as a Prometheus installed to scrape the controller
// holds.
func MetricsReaderToken(ctx context.Context, c client.Client, namespace, name string) (string, error) {
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-" + MetricsReaderRole},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: MetricsReaderRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: name}},
	}
	if err := c.Create(ctx, binding); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("bind %s to %s/%s: %w", MetricsReaderRole, namespace, name, err)
	}
	return ServiceAccountToken(ctx, c, namespace, name)
}

// insecureTLS accepts the controller's self-signed metrics certificate,
// as the chart's ServiceMonitor does (insecureSkipVerify).
var insecureTLS = &http.Client{Transport: &http.Transport{
	TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a self-signed certificate: encrypted, not verified, as Prometheus is configured
}}

// ScrapeSecure reads https://addr/metrics presenting token (empty: none)
// and returns the counters' and gauges' series by metric name; an answer
// other than 200 is a *StatusError.
func ScrapeSecure(ctx context.Context, addr, token string) (map[string][]Sample, error) {
	return scrape(ctx, insecureTLS, "https://"+addr+"/metrics", token)
}
