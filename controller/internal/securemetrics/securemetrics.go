package securemetrics

import (
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/sockscale/sockscale/internal/securemetrics"
)

// The filter asks the API server about every scrape (cached a minute for
// tokens, five for allowed requests): the controller's ServiceAccount
// creates the reviews.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Config is what the flags say about the metrics endpoint.
type Config = securemetrics.Config

// Options turns the flags into controller-runtime's metrics server
// options, or says which flag is wrong (Config.Check: controller-runtime
// would fall back to a self-signed certificate without a word).
func Options(c Config) (metricsserver.Options, error) {
	o := metricsserver.Options{BindAddress: c.BindAddress}
	if c.Secure && c.BindAddress != "0" {
		o.SecureServing = true
		o.FilterProvider = filter
	}
	if err := c.Check(); err != nil || !o.SecureServing {
		return o, err
	}
	if !c.HTTP2 {
		o.TLSOpts = append(o.TLSOpts, func(t *tls.Config) { t.NextProtos = []string{"http/1.1"} })
	}
	if c.CertDir == "" {
		// controller-runtime makes a self-signed certificate when the
		// directory holds none: point it at one that cannot exist.
		o.CertDir = filepath.Join(os.TempDir(), "sockscale-no-metrics-cert")
		return o, nil
	}
	o.CertDir, o.CertName, o.KeyName = c.CertDir, c.CertName, c.KeyName
	return o, nil
}

// filter is securemetrics.NewFilter as controller-runtime takes it.
func filter(cfg *rest.Config, hc *http.Client) (metricsserver.Filter, error) {
	f, err := securemetrics.NewFilter(cfg, hc)
	if err != nil {
		return nil, err
	}
	return func(log logr.Logger, next http.Handler) (http.Handler, error) { return f(log, next), nil }, nil
}
