package securemetrics

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name string
		c    Config
		err  string // a substring; empty: no error
	}{
		{"secure, self-signed", Config{BindAddress: ":9090", Secure: true}, ""},
		{"given certificate", Config{BindAddress: ":9090", Secure: true, CertDir: dir, CertName: "tls.crt", KeyName: "tls.key"}, ""},
		{"plain", Config{BindAddress: ":9090"}, ""},
		{"missing key", Config{BindAddress: ":9090", Secure: true, CertDir: dir, CertName: "tls.crt", KeyName: "nope.key"},
			`--metrics-cert-key="nope.key" in --metrics-cert-path="` + dir + `"`},
		{"empty name", Config{BindAddress: ":9090", Secure: true, CertDir: dir, KeyName: "tls.key"}, "--metrics-cert-name is empty"},
		{"certificate without TLS", Config{BindAddress: ":9090", CertDir: dir}, "needs --metrics-secure"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.c.Check()
			if tt.err == "" && err != nil || tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
				t.Fatalf("err %v, want %q", err, tt.err)
			}
		})
	}
}

// The agent's and the activator's defaults: secure, self-signed.
func TestBindFlags(t *testing.T) {
	var c Config
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	BindFlags(fs, &c)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Config{Secure: true, CertName: "tls.crt", KeyName: "tls.key"}, c); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
}

// A self-signed certificate is made when none is given; a given one is
// served from its files.
func TestTLSConfig(t *testing.T) {
	tc, err := tlsConfig(Config{Secure: true})
	if err != nil || len(tc.Certificates) != 1 || tc.GetCertificate != nil {
		t.Fatalf("self-signed: %v, %d certificates", err, len(tc.Certificates))
	}
	if _, err := tlsConfig(Config{Secure: true, CertDir: t.TempDir(), CertName: "tls.crt", KeyName: "tls.key"}); err == nil ||
		!strings.Contains(err.Error(), "metrics serving certificate") {
		t.Errorf("missing files: %v, want a metrics serving certificate error", err)
	}
}
