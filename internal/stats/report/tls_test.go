package report

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sockscale/sockscale/internal/stats"
)

// TestSendOverTLS: with a CA file the reporter posts over HTTPS to the
// resolved addresses and verifies the Service's name (httptest's
// certificate names example.com); a CA that did not sign the certificate
// fails every post; a changed file is read again.
func TestSendOverTLS(t *testing.T) {
	got := make(chan *stats.Batch, 4)
	srv := httptest.NewTLSServer(replica(func(b *stats.Batch) { got <- b }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	write := func(der []byte) {
		t.Helper()
		if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(selfSigned(t)) // a CA that did not sign srv's certificate

	rec := &counts{}
	r, err := New("example.com:"+port, 2*time.Second, rec, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	r.resolve = func(context.Context, string) ([]string, error) { return []string{"127.0.0.1"}, nil }
	if err := r.SetCAFile(caFile); err != nil {
		t.Fatal(err)
	}
	batch := &stats.Batch{Node: "n", Start: time.Now(), Period: time.Second}
	r.Send(t.Context(), batch)
	if rec.ok != 0 || rec.fail != 1 {
		t.Fatalf("with a foreign CA: ok=%d fail=%d, want the post to fail verification", rec.ok, rec.fail)
	}
	// The right CA, written later (a renewed Secret): read again.
	time.Sleep(10 * time.Millisecond) // a new modification time
	write(srv.Certificate().Raw)
	r.Send(t.Context(), batch)
	if rec.ok != 1 {
		t.Fatalf("with the server's CA: ok=%d fail=%d, want one post", rec.ok, rec.fail)
	}
	if b := <-got; b.Node != "n" {
		t.Errorf("got batch of %q", b.Node)
	}
	if err := r.SetCAFile(filepath.Join(dir, "missing")); err == nil {
		t.Error("SetCAFile accepted a missing file")
	}
	if err := os.WriteFile(caFile, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := (&Reporter{host: "h"}).SetCAFile(caFile); err == nil {
		t.Error("SetCAFile accepted a file with no certificate")
	}
}

func selfSigned(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other CA"}, DNSNames: []string{"example.com"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}
