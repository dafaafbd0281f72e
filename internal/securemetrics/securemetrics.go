package securemetrics

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"

	"github.com/sockscale/sockscale/internal/certfile"
	"github.com/sockscale/sockscale/internal/serve"
)

// Config is what the flags say about the metrics endpoint.
type Config struct {
	// BindAddress is --metrics-bind-address; "0" turns the endpoint off
	// (the controller's only).
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
	// HTTP2 is --enable-http2 (the controller's only). Off by default:
	// HTTP/2's stream handling has had denial-of-service flaws (rapid
	// reset, CVE-2023-44487) and a scraper needs none of it.
	HTTP2 bool
}

// BindFlags defines --metrics-secure, --metrics-cert-path,
// --metrics-cert-name and --metrics-cert-key on fs, as the agent and the
// activator take them (the controller's own flag set defines the same).
func BindFlags(fs *flag.FlagSet, c *Config) {
	fs.BoolVar(&c.Secure, "metrics-secure", true, "serve /metrics over HTTPS to callers the API server authenticates and authorizes (get on the /metrics non-resource URL, e.g. the chart's <release>-metrics-reader ClusterRole); false: plain HTTP to anyone")
	fs.StringVar(&c.CertDir, "metrics-cert-path", "", "directory of the metrics server's certificate and key, reloaded when they change (empty: a self-signed one)")
	fs.StringVar(&c.CertName, "metrics-cert-name", "tls.crt", "certificate file in --metrics-cert-path")
	fs.StringVar(&c.KeyName, "metrics-cert-key", "tls.key", "key file in --metrics-cert-path")
}

// Check says which flag is wrong. A certificate directory that lacks the
// files is refused, because a self-signed certificate in their place
// would fail every scraper that verifies it, without a word at start.
func (c Config) Check() error {
	if !c.Secure || c.BindAddress == "0" {
		if c.CertDir != "" {
			return fmt.Errorf("--metrics-cert-path=%q needs --metrics-secure (the certificate serves HTTPS only)", c.CertDir)
		}
		return nil
	}
	if c.CertDir == "" {
		return nil
	}
	var errs []error
	for _, f := range []struct{ flag, name string }{{"--metrics-cert-name", c.CertName}, {"--metrics-cert-key", c.KeyName}} {
		if f.name == "" {
			errs = append(errs, fmt.Errorf("%s is empty: want a file name in --metrics-cert-path=%q, e.g. tls.crt", f.flag, c.CertDir))
			continue
		}
		if _, err := os.Stat(filepath.Join(c.CertDir, f.name)); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q in --metrics-cert-path=%q: %w", f.flag, f.name, c.CertDir, err))
		}
	}
	return errors.Join(errs...)
}

// Serve serves h at c.BindAddress until ctx ends: plain HTTP unless
// c.Secure, else HTTPS behind NewFilter's reviews, which cfg's client
// asks of the API server (its ServiceAccount needs create on tokenreviews
// and subjectaccessreviews). Only h is behind the filter: the health
// endpoints, which the kubelet probes without a token, are served apart.
func Serve(ctx context.Context, c Config, cfg *rest.Config, h http.Handler, log logr.Logger) error {
	if err := c.Check(); err != nil {
		return err
	}
	if !c.Secure {
		return serve.Serve(ctx, c.BindAddress, h)
	}
	srv, err := NewServer(c, cfg, h, log)
	if err != nil {
		return err
	}
	return serve.Server(ctx, srv)
}

// NewServer is Serve's HTTPS server, for a caller with its own listener.
func NewServer(c Config, cfg *rest.Config, h http.Handler, log logr.Logger) (*http.Server, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("metrics auth: client of the API server: %w", err)
	}
	filter, err := NewFilter(cfg, hc)
	if err != nil {
		return nil, fmt.Errorf("metrics auth: %w", err)
	}
	tc, err := tlsConfig(c)
	if err != nil {
		return nil, err
	}
	srv := serve.New(c.BindAddress, filter(log, h))
	srv.TLSConfig = tc
	if !c.HTTP2 {
		// A non-nil, empty map keeps net/http from offering h2.
		srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
	}
	return srv, nil
}

// tlsConfig serves the pair in c.CertDir, or a self-signed one made now
// (as controller-runtime's metrics server and the
// kube-controller-manager do: encrypted, not verified).
func tlsConfig(c Config) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CertDir != "" {
		pair, err := certfile.Load(filepath.Join(c.CertDir, c.CertName), filepath.Join(c.CertDir, c.KeyName))
		if err != nil {
			return nil, fmt.Errorf("metrics %w", err)
		}
		tc.GetCertificate = pair.GetCertificate
		return tc, nil
	}
	cert, key, err := certutil.GenerateSelfSignedCertKeyWithFixtures("localhost", []net.IP{{127, 0, 0, 1}}, nil, "")
	if err != nil {
		return nil, fmt.Errorf("self-signed metrics certificate: %w", err)
	}
	pair, err := tls.X509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("self-signed metrics certificate: %w", err)
	}
	tc.Certificates = []tls.Certificate{pair}
	return tc, nil
}
