package securemetrics

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	authenticationv1 "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1 "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/client-go/rest"
)

// reviewBackoff retries a review the API server did not answer: five
// tries over about 4 s, well inside a scrape timeout.
var reviewBackoff = wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}

// Filter wraps a handler: only requests the API server authenticated and
// authorized reach it. log gets why a request was refused.
type Filter func(log logr.Logger, next http.Handler) http.Handler

// NewFilter authenticates each request's bearer token with a TokenReview and
// authorizes a get of its path with a SubjectAccessReview, both cached.
// It does what controller-runtime's filters.WithAuthenticationAndAuthorization
// does except for one answer: a token the API server refuses is a 401
// here (as kube-apiserver itself answers), where that filter answers 500
// "Authentication failed", which reads as a server fault and makes
// Prometheus report the target as broken rather than unauthorized.
func NewFilter(cfg *rest.Config, hc *http.Client) (Filter, error) {
	authn, err := authenticationv1.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("tokenreview client: %w", err)
	}
	authz, err := authorizationv1.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("subjectaccessreview client: %w", err)
	}
	backoff := reviewBackoff
	authenticator, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		Anonymous:                &apiserver.AnonymousAuthConfig{Enabled: false},
		CacheTTL:                 time.Minute,
		TokenAccessReviewClient:  authn,
		TokenAccessReviewTimeout: 10 * time.Second,
		WebhookRetryBackoff:      &backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("authenticator: %w", err)
	}
	authorize, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: authz,
		AllowCacheTTL:             5 * time.Minute,
		DenyCacheTTL:              30 * time.Second,
		WebhookRetryBackoff:       &backoff,
	}.New()
	if err != nil {
		return nil, fmt.Errorf("authorizer: %w", err)
	}
	return func(log logr.Logger, next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			res, ok, err := authenticator.AuthenticateRequest(r)
			if err != nil || !ok {
				// The reason (expired, another issuer, review failed)
				// goes to the log, not to an unauthenticated caller.
				log.V(1).Info("metrics request not authenticated", "remote", r.RemoteAddr, "err", err)
				http.Error(w, "Unauthorized: send a bearer token the Kubernetes API server accepts (a ServiceAccount token)", http.StatusUnauthorized)
				return
			}
			attrs := authorizer.AttributesRecord{User: res.User, Verb: strings.ToLower(r.Method), Path: r.URL.Path}
			decision, reason, err := authorize.Authorize(r.Context(), attrs)
			if err != nil {
				log.Error(err, "metrics request: authorization review failed", "user", res.User.GetName())
				http.Error(w, "the authorization review with the API server failed; try again", http.StatusInternalServerError)
				return
			}
			if decision != authorizer.DecisionAllow {
				log.V(1).Info("metrics request forbidden", "user", res.User.GetName(), "reason", reason)
				http.Error(w, fmt.Sprintf("Forbidden: %s may not %s %s; bind it to the chart's <release>-metrics-reader ClusterRole",
					res.User.GetName(), attrs.Verb, attrs.Path), http.StatusForbidden)
				return
			}
			next.ServeHTTP(w, r)
		})
	}, nil
}
