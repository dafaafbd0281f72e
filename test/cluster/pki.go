package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

type identity struct{ name, user, groups string }

// Identities the control plane knows, by bearer token (--token-auth-file).
// The node simulator and CoreDNS use the admin identity: the simulator acts
// for every node and asks for every pod's ServiceAccount token.
var identities = []identity{
	{"admin", "sockscale-admin", "system:masters"},
	{"kube-controller-manager", "system:kube-controller-manager", ""},
	{"kube-scheduler", "system:kube-scheduler", ""},
	{"kube-proxy", "system:kube-proxy", ""},
}

// pki writes, once per state dir, the CA, the apiserver's serving
// certificate, the ServiceAccount signing key and the token file; an `up`
// after `down` reuses them so kubeconfigs users copied stay valid.
func pki(dir string) error {
	_, err1 := os.Stat(filepath.Join(dir, "tokens.csv"))
	_, err2 := os.Stat(filepath.Join(dir, "kubelet-client.crt"))
	if err1 == nil && err2 == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	now := time.Now()
	ca, caKey, caDER, err := newCA("sockscale-cluster-ca", now)
	if err != nil {
		return err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc." + ClusterDomain},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IP(HostIP.AsSlice()), net.IP(KubernetesServiceIP.AsSlice())},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	// The apiserver's client certificate to the simulated kubelets (logs).
	kcKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	kcDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(3),
		Subject:      pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, &kcKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	kcKeyDER, err := x509.MarshalECPrivateKey(kcKey)
	if err != nil {
		return err
	}
	// ServiceAccount tokens are signed with RSA, what every client expects.
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	caKeyDER, err := x509.MarshalECPrivateKey(caKey)
	if err != nil {
		return err
	}
	srvKeyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return err
	}
	tokens := ""
	for _, id := range identities {
		line, err := tokenLine(id)
		if err != nil {
			return err
		}
		tokens += line
	}
	files := []struct {
		name, typ string
		der       []byte
	}{
		{"ca.crt", "CERTIFICATE", caDER},
		{"ca.key", "EC PRIVATE KEY", caKeyDER},
		{"apiserver.crt", "CERTIFICATE", srvDER},
		{"apiserver.key", "EC PRIVATE KEY", srvKeyDER},
		{"sa.key", "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)},
		{"sa.pub", "PUBLIC KEY", saPub},
		{"kubelet-client.crt", "CERTIFICATE", kcDER},
		{"kubelet-client.key", "EC PRIVATE KEY", kcKeyDER},
	}
	for _, f := range files {
		b := pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der})
		if err := os.WriteFile(filepath.Join(dir, f.name), b, 0o600); err != nil {
			return err
		}
	}
	// Written last: its presence says the rest is complete.
	return os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(tokens), 0o600)
}

// tokenLine is id's line of tokens.csv with a new random token.
func tokenLine(id identity) (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s,%s,%s,%q\n", hex.EncodeToString(b), id.user, id.user, id.groups), nil
}

// nodeIdentity is a real node's kubelet: the Node authorizer's
// system:node:<name> in system:nodes, as a kubeadm node's credentials.
func nodeIdentity(node string) identity {
	return identity{name: node, user: "system:node:" + node, groups: "system:nodes"}
}

// addIdentity gives id a token in tokens.csv unless it has one; the API
// server reads the file when it starts.
func addIdentity(dir string, id identity) error {
	if _, err := tokenOf(dir, id.user); err == nil {
		return nil
	}
	line, err := tokenLine(id)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, "tokens.csv"), os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(line); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// token is the bearer token of identity name (see identities).
func token(dir, name string) (string, error) {
	for _, id := range identities {
		if id.name == name {
			return tokenOf(dir, id.user)
		}
	}
	return "", errors.New("no identity " + name)
}

func tokenOf(dir, user string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "tokens.csv"))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Split(line, ","); len(f) > 2 && f[1] == user {
			return f[0], nil
		}
	}
	return "", errors.New("no token for " + user)
}

// kubeconfig writes a kubeconfig for identity name and returns its path.
func kubeconfig(dir, name string) (string, error) {
	tok, err := token(dir, name)
	if err != nil {
		return "", err
	}
	return writeKubeconfig(dir, name, tok)
}

// writeKubeconfig writes <dir>/<name>.kubeconfig with tok.
func writeKubeconfig(dir, name, tok string) (string, error) {
	path := filepath.Join(dir, name+".kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: sockscale-cluster
  cluster:
    server: https://%s:%d
    certificate-authority: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: sockscale-cluster
  context: {cluster: sockscale-cluster, user: %s}
current-context: sockscale-cluster
`, HostIP, APIServerPort, filepath.Join(dir, "ca.crt"), name, tok, name)
	return path, os.WriteFile(path, []byte(kc), 0o600)
}

func certPool(caPEM []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("no certificate in the CA file")
	}
	return pool, nil
}

// frontProxyPKI writes, once per state dir, the aggregation layer's
// front-proxy CA and the API server's client certificate signed by it
// (kubeadm's front-proxy-ca and front-proxy-client). The API server shows
// that certificate when it forwards a request to an API service such as
// the controller's metrics APIs, which trust the user named in the
// request's X-Remote-User headers only from a client the CA signed. A
// separate CA from the cluster's: a certificate the cluster CA signs for
// anyone else must not be able to claim a user.
func frontProxyPKI(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "front-proxy-client.key")); err == nil {
		return nil
	}
	now := time.Now()
	ca, caKey, caDER, err := newCA("sockscale-front-proxy-ca", now)
	if err != nil {
		return err
	}
	clientKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	clientDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: frontProxyClient},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, &clientKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	clientKeyDER, err := x509.MarshalECPrivateKey(clientKey)
	if err != nil {
		return err
	}
	// The key last: its presence says the rest is complete.
	for _, f := range []struct {
		name, typ string
		der       []byte
	}{
		{"front-proxy-ca.crt", "CERTIFICATE", caDER},
		{"front-proxy-client.crt", "CERTIFICATE", clientDER},
		{"front-proxy-client.key", "EC PRIVATE KEY", clientKeyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, f.name), pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// newCA makes a self-signed CA named cn, valid for ten years from now.
func newCA(cn string, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, der, err
}

// frontProxyClient is the name of the API server's front-proxy client
// certificate, the only name API services accept forwarded users from
// (--requestheader-allowed-names).
const frontProxyClient = "front-proxy-client"
