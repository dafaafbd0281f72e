package stack

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// MetricsReaderRole is the chart's ClusterRole for scrapers of the
// controller's, the agents' and the activators' /metrics (release
// "sockscale").
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

// The harness's own scraper (ScrapeToken): a ServiceAccount in "default", which outlives
// an uninstall of the release (the lifecycle tests delete its namespace),
// bound to MetricsReaderRole, which the chart brings back with the release.
const (
	ScraperNamespace = "default"
	ScraperName      = "sockscale-harness-scraper"
	// scraperTokenLife is how long a token is reused: well inside the
	// hour TokenRequest grants it.
	scraperTokenLife = 30 * time.Minute
)

// scraper holds the harness scraper's token.
type scraper struct {
	mu    sync.Mutex
	token string
	made  time.Time
}

// ScrapeToken is a token the agents and activators (and the controller)
// take for their /metrics: the harness scraper's, made on first use and
// reused for half an hour.
func (s *Stack) ScrapeToken(ctx context.Context) (string, error) {
	s.scraper.mu.Lock()
	defer s.scraper.mu.Unlock()
	if s.scraper.token != "" && time.Since(s.scraper.made) < scraperTokenLife {
		return s.scraper.token, nil
	}
	t, err := MetricsReaderToken(ctx, s.Client, ScraperNamespace, ScraperName)
	if err != nil {
		return "", err
	}
	s.scraper.token, s.scraper.made = t, time.Now()
	return t, nil
}

// forgetToken drops a token the endpoint refused.
func (s *Stack) forgetToken(token string) {
	s.scraper.mu.Lock()
	defer s.scraper.mu.Unlock()
	if s.scraper.token == token {
		s.scraper.token = ""
	}
}

// Scrape reads https://ip:port/metrics of an agent or activator of the
// release (--metrics-secure, the chart's default) with ScrapeToken, and
// returns the counters' and gauges' series by metric name. A 401 (the
// scraper's ServiceAccount was deleted) gets a new token and one more try.
func (s *Stack) Scrape(ctx context.Context, ip netip.Addr, port uint16) (map[string][]Sample, error) {
	addr := netip.AddrPortFrom(ip, port).String()
	for try := 0; ; try++ {
		token, err := s.ScrapeToken(ctx)
		if err != nil {
			return nil, err
		}
		m, err := ScrapeSecure(ctx, addr, token)
		var se *StatusError
		if try == 0 && errors.As(err, &se) && se.Code == http.StatusUnauthorized {
			s.forgetToken(token)
			continue
		}
		return m, err
	}
}

// MetricsRequest is a GET of https://addr/metrics with ScrapeToken, for
// a reader that parses the text itself; send it with MetricsClient.
func (s *Stack) MetricsRequest(ctx context.Context, addr string) (*http.Request, error) {
	token, err := s.ScrapeToken(ctx)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	return req, nil
}

// MetricsClient sends MetricsRequests: it accepts the self-signed
// certificates, as the chart's monitors do (insecureSkipVerify).
func MetricsClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: insecureTLS.Transport}
}
