package securemetrics

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// The filter asks the API server about every scrape (cached a minute for
// tokens, five for allowed requests): the controller's ServiceAccount
// creates the reviews.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Config is what the flags say about the metrics endpoint.
type Config struct {
	// BindAddress is --metrics-bind-address; "0" turns the endpoint off.
	BindAddress string
	// Secure is --metrics-secure: HTTPS with authentication and
	// authorization. False serves plain HTTP to anyone who can connect,
	// for clusters where a NetworkPolicy or a sidecar does that job.
	Secure bool
	// CertDir is --metrics-cert-path: the directory of CertName and
	// KeyName (a mounted Secret, e.g. from cert-manager), reloaded when
	// they change. Empty: a self-signed certificate made at start, which
	// scrapers accept with insecureSkipVerify as they do the
	// kube-controller-manager's.
	CertDir, CertName, KeyName string
	// HTTP2 is --enable-metrics-http2. Off by default: HTTP/2's stream
	// handling has had denial-of-service flaws (rapid reset, CVE-2023-44487)
	// and a scraper needs none of it.
	HTTP2 bool
}

// Options turns the flags into controller-runtime's metrics server
// options, or says which flag is wrong. A certificate directory that
// lacks the files is refused here, because controller-runtime would fall
// back to a self-signed certificate without a word.
func Options(c Config) (metricsserver.Options, error) {
	o := metricsserver.Options{BindAddress: c.BindAddress}
	if !c.Secure || c.BindAddress == "0" {
		if c.CertDir != "" {
			return o, fmt.Errorf("--metrics-cert-path=%q needs --metrics-secure (the certificate serves HTTPS only)", c.CertDir)
		}
		return o, nil
	}
	o.SecureServing = true
	o.FilterProvider = filter
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
	var errs []error
	for flag, name := range map[string]string{"--metrics-cert-name": c.CertName, "--metrics-cert-key": c.KeyName} {
		if name == "" {
			errs = append(errs, fmt.Errorf("%s is empty: want a file name in --metrics-cert-path=%q, e.g. tls.crt", flag, c.CertDir))
			continue
		}
		if _, err := os.Stat(filepath.Join(c.CertDir, name)); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q in --metrics-cert-path=%q: %w", flag, name, c.CertDir, err))
		}
	}
	return o, errors.Join(errs...)
}
