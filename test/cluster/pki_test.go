package cluster

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
)

// TestFrontProxyPKI: the API server's front-proxy client certificate
// chains to the front-proxy CA, for client authentication, under the one
// name API services accept forwarded users from, and not to the cluster
// CA (a certificate that CA signs for anyone else must not claim a user);
// a second call keeps what the first wrote. The cluster CA still signs the
// API server's certificate.
func TestFrontProxyPKI(t *testing.T) {
	dir := t.TempDir()
	if err := pki(dir); err != nil {
		t.Fatal(err)
	}
	if err := frontProxyPKI(dir); err != nil {
		t.Fatal(err)
	}
	read := func(name string) *x509.Certificate {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(b)
		if block == nil {
			t.Fatalf("%s: no PEM", name)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	client := read("front-proxy-client.crt")
	verify := func(caFile string) error {
		pool := x509.NewCertPool()
		pool.AddCert(read(caFile))
		_, err := client.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		return err
	}
	if err := verify("front-proxy-ca.crt"); err != nil {
		t.Errorf("front-proxy client against its CA: %v", err)
	}
	if err := verify("ca.crt"); err == nil {
		t.Error("front-proxy client verified against the cluster CA: want a CA of its own")
	}
	clusterCA := x509.NewCertPool()
	clusterCA.AddCert(read("ca.crt"))
	if _, err := read("apiserver.crt").Verify(x509.VerifyOptions{Roots: clusterCA, DNSName: "kubernetes.default.svc"}); err != nil {
		t.Errorf("the API server's certificate against the cluster CA: %v", err)
	}
	if client.Subject.CommonName != frontProxyClient {
		t.Errorf("client name %q, want %q", client.Subject.CommonName, frontProxyClient)
	}
	before, _ := os.ReadFile(filepath.Join(dir, "front-proxy-client.crt"))
	if err := frontProxyPKI(dir); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "front-proxy-client.crt")); string(after) != string(before) {
		t.Error("a second call wrote a new certificate: an up after a down must keep it")
	}
}
