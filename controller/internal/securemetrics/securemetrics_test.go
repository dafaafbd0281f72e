package securemetrics

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestOptions(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name   string
		c      Config
		secure bool
		err    string // a substring; empty: no error
	}{
		{"secure, self-signed", Config{BindAddress: ":8080", Secure: true}, true, ""},
		{"given certificate", Config{BindAddress: ":8080", Secure: true, CertDir: dir, CertName: "tls.crt", KeyName: "tls.key"}, true, ""},
		{"plain", Config{BindAddress: ":8080"}, false, ""},
		{"off", Config{BindAddress: "0", Secure: true}, false, ""},
		{"missing key", Config{BindAddress: ":8080", Secure: true, CertDir: dir, CertName: "tls.crt", KeyName: "nope.key"}, true,
			`--metrics-cert-key="nope.key" in --metrics-cert-path="` + dir + `"`},
		{"empty name", Config{BindAddress: ":8080", Secure: true, CertDir: dir, KeyName: "tls.key"}, true, "--metrics-cert-name is empty"},
		{"certificate without TLS", Config{BindAddress: ":8080", CertDir: dir}, false, "needs --metrics-secure"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o, err := Options(tt.c)
			if tt.err == "" && err != nil || tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
				t.Fatalf("err %v, want %q", err, tt.err)
			}
			if o.SecureServing != tt.secure || (o.FilterProvider != nil) != tt.secure {
				t.Errorf("SecureServing %v, filter %v; want both %v", o.SecureServing, o.FilterProvider != nil, tt.secure)
			}
			if tt.secure && tt.err == "" && tt.c.CertDir == "" {
				if _, err := os.Stat(o.CertDir); err == nil {
					t.Errorf("CertDir %s exists: controller-runtime would load it instead of a self-signed certificate", o.CertDir)
				}
			}
		})
	}
}
