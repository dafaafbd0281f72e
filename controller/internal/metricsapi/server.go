package metricsapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authentication/request/headerrequest"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/authorization/path"
	"k8s.io/apiserver/pkg/authorization/union"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	openapicommon "k8s.io/kube-openapi/pkg/common"
	cmapiserver "sigs.k8s.io/custom-metrics-apiserver/pkg/apiserver"
	generatedcore "sigs.k8s.io/custom-metrics-apiserver/pkg/generated/openapi/core"
	generatedcustommetrics "sigs.k8s.io/custom-metrics-apiserver/pkg/generated/openapi/custommetrics"
	generatedexternalmetrics "sigs.k8s.io/custom-metrics-apiserver/pkg/generated/openapi/externalmetrics"
	"sigs.k8s.io/custom-metrics-apiserver/pkg/provider"
)

// APIs says which metrics APIs a Server serves.
type APIs uint8

const (
	// CustomMetrics is custom.metrics.k8s.io: concurrency and rps per pod.
	CustomMetrics APIs = 1 << iota
	// ExternalMetrics is external.metrics.k8s.io: concurrency, rps and
	// activator_concurrency per Deployment.
	ExternalMetrics
)

// The ConfigMap where the API server publishes how it authenticates to
// extension API servers (its front proxy's CA and headers) and the CA of
// client certificates: what the aggregation layer's clients are trusted
// by.
const (
	authenticationConfigMapNamespace = "kube-system"
	authenticationConfigMapName      = "extension-apiserver-authentication"
)

// ServerOptions configure a Server.
type ServerOptions struct {
	// BindAddress is where to serve HTTPS, [host]:port, e.g. :6443; port
	// 0 picks a free one (Server.Addr says which).
	BindAddress string
	// CertFile and KeyFile are the serving certificate and key (PEM),
	// loaded again when they change.
	CertFile, KeyFile string
	// Kube reaches the API server: TokenReviews authenticate bearer
	// tokens, SubjectAccessReviews authorize every request, and the
	// ConfigMap kube-system/extension-apiserver-authentication says which
	// client certificates to trust (the front proxy's, with the user in
	// its headers; and the cluster's client CA).
	Kube *rest.Config
	// APIs are the APIs to serve, CustomMetrics, ExternalMetrics or both.
	APIs APIs
	// Provider gives the values.
	Provider *Provider
}

// Server serves the metrics APIs as an extension API server, for the
// aggregation layer (an APIService per API) to route to.
type Server struct {
	server   *cmapiserver.CustomMetricsAdapterServer
	listener net.Listener
}

// serverName is the server's name in its logs and OpenAPI document.
const serverName = "sockscale-metrics"

// NewServer binds o.BindAddress and returns the server, ready to Run.
//
// Of the library's options, these matter and are set here: delegated
// authentication and authorization through o.Kube, with its caches of 10 s
// (TokenReview) and 10 s allowed / 10 s denied (SubjectAccessReview), as
// the library's defaults; no anonymous requests (no credentials: 401),
// where the library allows them through to authorization; members of
// system:masters allowed without a review, and /healthz, /livez and
// /readyz without authorization, as its defaults; no profiling, no
// metrics endpoint (the controller has its own), no priority and
// fairness (the library turns it off: the API server's own already
// applies to what the aggregator forwards); the OpenAPI definitions the
// library ships, so the aggregator merges a valid document.
func NewServer(o ServerOptions) (*Server, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", o.BindAddress)
	if err != nil {
		return nil, fmt.Errorf("metrics API: listen on %s: %w", o.BindAddress, err)
	}
	s, err := newServer(o, ln)
	if err != nil {
		_ = ln.Close()
		return nil, err
	}
	return s, nil
}

func (o *ServerOptions) validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(o.BindAddress); err != nil {
		errs = append(errs, fmt.Errorf("metrics API bind address %q: want [host]:port, e.g. :6443", o.BindAddress))
	}
	if o.CertFile == "" || o.KeyFile == "" {
		errs = append(errs, fmt.Errorf("metrics API certificate %q and key %q: set both (the aggregation layer speaks HTTPS only)", o.CertFile, o.KeyFile))
	}
	if o.Kube == nil {
		errs = append(errs, errors.New("metrics API: no rest.Config to review requests with"))
	}
	if o.APIs == 0 || o.APIs&^(CustomMetrics|ExternalMetrics) != 0 {
		errs = append(errs, fmt.Errorf("metrics APIs %d: want CustomMetrics, ExternalMetrics or both", o.APIs))
	}
	if o.Provider == nil {
		errs = append(errs, errors.New("metrics API: no Provider"))
	}
	return errors.Join(errs...)
}

func newServer(o ServerOptions, ln net.Listener) (*Server, error) {
	cfg := genericapiserver.NewConfig(cmapiserver.Codecs)
	cfg.EnableProfiling, cfg.EnableContentionProfiling, cfg.EnableMetrics = false, false, false
	// Nothing in this server calls itself, and a loopback config with a
	// token would be an identity that skips authorization: an empty one
	// satisfies the library and authorizes nothing.
	cfg.LoopbackClientConfig = &rest.Config{}

	serving := genericoptions.NewSecureServingOptions()
	serving.Listener = ln
	serving.ServerCert.CertKey = genericoptions.CertKey{CertFile: o.CertFile, KeyFile: o.KeyFile}
	if err := serving.ApplyTo(&cfg.SecureServing); err != nil {
		return nil, fmt.Errorf("metrics API serving certificate: %w", err)
	}
	if err := delegateAuthentication(cfg, o.Kube); err != nil {
		return nil, err
	}
	authz, err := delegatedAuthorizer(o.Kube)
	if err != nil {
		return nil, err
	}
	cfg.Authorization.Authorizer = authz
	cfg.OpenAPIConfig, cfg.OpenAPIV3Config = openAPIConfigs(o.APIs)

	// The library installs the API of each provider that is not nil.
	var custom provider.CustomMetricsProvider
	var external provider.ExternalMetricsProvider
	if o.APIs&CustomMetrics != 0 {
		custom = o.Provider
	}
	if o.APIs&ExternalMetrics != 0 {
		external = o.Provider
	}
	srv, err := (&cmapiserver.Config{GenericConfig: cfg}).Complete(nil).New(serverName, custom, external)
	if err != nil {
		return nil, fmt.Errorf("metrics API server: %w", err)
	}
	return &Server{server: srv, listener: ln}, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.listener.Addr() }

// Run serves until ctx ends, then drains the requests in flight.
func (s *Server) Run(ctx context.Context) error {
	if err := s.server.GenericAPIServer.PrepareRun().RunWithContext(ctx); err != nil {
		return fmt.Errorf("metrics API server: %w", err)
	}
	return nil
}

// reviewTimeout bounds each TokenReview and SubjectAccessReview, as the
// library's defaults do.
const reviewTimeout = 10 * time.Second

// reviewClient is a client of kube for the reviews: with the library's
// limits (200 a second, bursts of 400), since every request this server
// takes may cost one of each.
func reviewClient(kube *rest.Config, timeout time.Duration) (kubernetes.Interface, error) {
	c := rest.CopyConfig(kube)
	c.QPS, c.Burst, c.Timeout = 200, 400, timeout
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("metrics API review client: %w", err)
	}
	return cs, nil
}

// delegateAuthentication sets cfg to authenticate bearer tokens with
// TokenReviews, client certificates of the cluster's client CA, and the
// aggregator's front-proxy certificate with the user in its headers, the
// last two read from the extension-apiserver-authentication ConfigMap (and
// followed as it changes). What the options package does from a
// kubeconfig file, from a rest.Config.
func delegateAuthentication(cfg *genericapiserver.Config, kube *rest.Config) error {
	// No timeout on the client: TokenAccessReviewTimeout bounds reviews,
	// and the ConfigMap controllers watch.
	client, err := reviewClient(kube, 0)
	if err != nil {
		return err
	}
	clientCA, err := dynamiccertificates.NewDynamicCAFromConfigMapController("client-ca", authenticationConfigMapNamespace, authenticationConfigMapName, "client-ca-file", client)
	if err != nil {
		return fmt.Errorf("metrics API client CA: %w", err)
	}
	proxyCA, err := dynamiccertificates.NewDynamicCAFromConfigMapController("client-ca", authenticationConfigMapNamespace, authenticationConfigMapName, "requestheader-client-ca-file", client)
	if err != nil {
		return fmt.Errorf("metrics API front proxy CA: %w", err)
	}
	proxy := &genericoptions.DynamicRequestHeaderController{
		ConfigMapCAController: proxyCA,
		RequestHeaderAuthRequestController: headerrequest.NewRequestHeaderAuthRequestController(authenticationConfigMapName, authenticationConfigMapNamespace, client,
			"requestheader-username-headers", "requestheader-uid-headers", "requestheader-group-headers", "requestheader-extra-headers-prefix", "requestheader-allowed-names"),
	}
	// Read once now: without the front proxy's CA every request the
	// aggregator forwards would fail, so a server that cannot read it
	// does not start (the library does the same unless told to tolerate
	// it).
	if err := proxy.RunOnce(context.Background()); err != nil {
		return fmt.Errorf("metrics API: read %s/%s (the aggregator's front proxy CA and headers; the controller needs the Role extension-apiserver-authentication-reader): %w",
			authenticationConfigMapNamespace, authenticationConfigMapName, err)
	}
	headers := &authenticatorfactory.RequestHeaderConfig{
		CAContentProvider:   proxy,
		UsernameHeaders:     headerrequest.StringSliceProviderFunc(proxy.UsernameHeaders),
		UIDHeaders:          headerrequest.StringSliceProviderFunc(proxy.UIDHeaders),
		GroupHeaders:        headerrequest.StringSliceProviderFunc(proxy.GroupHeaders),
		ExtraHeaderPrefixes: headerrequest.StringSliceProviderFunc(proxy.ExtraHeaderPrefixes),
		AllowedClientNames:  headerrequest.StringSliceProviderFunc(proxy.AllowedClientNames),
	}
	// The TLS handshake asks for client certificates of either CA; the
	// serving layer runs both controllers (they are in its ClientCA).
	if err := cfg.Authentication.ApplyClientCert(clientCA, cfg.SecureServing); err != nil {
		return fmt.Errorf("metrics API client CA: %w", err)
	}
	if err := cfg.Authentication.ApplyClientCert(proxy, cfg.SecureServing); err != nil {
		return fmt.Errorf("metrics API front proxy CA: %w", err)
	}
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		Anonymous:                          &apiserver.AnonymousAuthConfig{Enabled: false},
		TokenAccessReviewClient:            client.AuthenticationV1(),
		TokenAccessReviewTimeout:           reviewTimeout,
		WebhookRetryBackoff:                genericoptions.DefaultAuthWebhookRetryBackoff(),
		CacheTTL:                           10 * time.Second,
		ClientCertificateCAContentProvider: clientCA,
		RequestHeaderConfig:                headers,
	}.New()
	if err != nil {
		return fmt.Errorf("metrics API authentication: %w", err)
	}
	cfg.Authentication.Authenticator = authn
	cfg.Authentication.RequestHeaderConfig = headers
	return nil
}

// delegatedAuthorizer allows system:masters and the health paths, and
// asks the API server (SubjectAccessReview) about everything else.
func delegatedAuthorizer(kube *rest.Config) (authorizer.Authorizer, error) {
	client, err := reviewClient(kube, reviewTimeout)
	if err != nil {
		return nil, err
	}
	health, err := path.NewAuthorizer([]string{"/healthz", "/readyz", "/livez"})
	if err != nil {
		return nil, fmt.Errorf("metrics API authorization: %w", err)
	}
	review, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: client.AuthorizationV1(),
		AllowCacheTTL:             10 * time.Second,
		DenyCacheTTL:              10 * time.Second,
		WebhookRetryBackoff:       genericoptions.DefaultAuthWebhookRetryBackoff(),
	}.New()
	if err != nil {
		return nil, fmt.Errorf("metrics API authorization: %w", err)
	}
	return union.New(authorizerfactory.NewPrivilegedGroups("system:masters"), health, review), nil
}

// openAPIConfigs are the OpenAPI v2 and v3 configurations of the APIs
// served, from the definitions the library ships.
func openAPIConfigs(apis APIs) (*openapicommon.Config, *openapicommon.OpenAPIV3Config) {
	getters := []openapicommon.GetOpenAPIDefinitions{generatedcore.GetOpenAPIDefinitions}
	if apis&CustomMetrics != 0 {
		getters = append(getters, generatedcustommetrics.GetOpenAPIDefinitions)
	}
	if apis&ExternalMetrics != 0 {
		getters = append(getters, generatedexternalmetrics.GetOpenAPIDefinitions)
	}
	defs := func(ref openapicommon.ReferenceCallback) map[string]openapicommon.OpenAPIDefinition {
		all := make(map[string]openapicommon.OpenAPIDefinition)
		for _, get := range getters {
			for k, v := range get(ref) {
				all[k] = v
			}
		}
		return all
	}
	namer := openapinamer.NewDefinitionNamer(cmapiserver.Scheme)
	v2 := genericapiserver.DefaultOpenAPIConfig(defs, namer)
	v2.Info.Title, v2.Info.Version = serverName, "1.0.0"
	v3 := genericapiserver.DefaultOpenAPIV3Config(defs, namer)
	v3.Info.Title, v3.Info.Version = serverName, "1.0.0"
	return v2, v3
}
