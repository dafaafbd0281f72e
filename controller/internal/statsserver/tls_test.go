package statsserver

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sockscale/sockscale/internal/stats"
)

// writePair writes a self-signed serving certificate for name and its key
// and returns the certificate.
func writePair(t *testing.T, dir, name string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for f, b := range map[string]*pem.Block{"tls.crt": {Type: "CERTIFICATE", Bytes: der}, "tls.key": {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(filepath.Join(dir, f), pem.EncodeToMemory(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// TestServerServesTLS: with a key pair the stats are served over HTTPS
// for the pair's name; a pair that does not load fails the start.
func TestServerServesTLS(t *testing.T) {
	dir := t.TempDir()
	const name = "sockscale-controller-stats.sockscale-system.svc"
	cert := writePair(t, dir, name)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	got := make(chan *stats.Batch, 1)
	s := &Server{Addr: addr, Handler: Handler(Options{Accept: func(b *stats.Batch) error { got <- b; return nil }}),
		CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: name}}}
	body, _ := stats.Append(nil, batchOf(1))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := c.Post("https://"+addr+stats.Path, stats.ContentType, bytes.NewReader(body))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent {
				t.Fatalf("POST over HTTPS: %s, want 204", resp.Status)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no HTTPS answer: %v", err)
		}
	}
	<-got
	// Plain HTTP to the TLS port is answered 400 by net/http, not served.
	if resp, err := http.Post("http://"+addr+stats.Path, stats.ContentType, bytes.NewReader(body)); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP to the HTTPS port: %s, want 400", resp.Status)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start: %v", err)
	}

	bad := &Server{Addr: "127.0.0.1:0", Handler: s.Handler, CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "missing.key")}
	if err := bad.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "missing.key") {
		t.Errorf("Start with a missing key: %v, want an error naming it", err)
	}
}
