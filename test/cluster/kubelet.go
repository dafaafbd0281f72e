package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The kubelet API of each simulated node, on <node IP>:10250, only as far
// as `kubectl logs` needs it: GET /containerLogs/<ns>/<pod>/<container>
// (follow, tailLines). Clients must present a certificate of the cluster CA
// (the apiserver's kubelet-client.crt).

const kubeletPort = 10250

func (s *sim) serveKubelet(ctx context.Context, n *simNode) error {
	cert, err := selfSignedCert(n.name, NodeIP(n.index))
	if err != nil {
		return err
	}
	pool, err := certPool(s.caPEM)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{ns}/{pod}/{container}", func(w http.ResponseWriter, r *http.Request) {
		s.containerLogs(w, r, r.PathValue("ns"), r.PathValue("pod"), r.PathValue("container"))
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, r.URL.Path+" is not served by the sockscale-cluster node simulator (only containerLogs)", http.StatusNotFound)
	})
	srv := &http.Server{
		Addr: net.JoinHostPort(NodeIP(n.index).String(), strconv.Itoa(kubeletPort)), Handler: mux,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12},
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	go func() {
		if err := srv.ListenAndServeTLS("", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.opts.Log.Warn("kubelet API", "node", n.name, "err", err)
		}
	}()
	return nil
}

// containerLogs writes a container's log file (the newest pod of that
// name), its last tailLines lines if asked, and follows it if asked.
func (s *sim) containerLogs(w http.ResponseWriter, r *http.Request, ns, pod, container string) {
	matches, _ := filepath.Glob(filepath.Join(s.opts.StateDir, "logs", "pods", fmt.Sprintf("%s_%s_*", ns, pod), container+".log"))
	var path string
	var newest time.Time
	for _, m := range matches {
		if st, err := os.Stat(m); err == nil && st.ModTime().After(newest) {
			path, newest = m, st.ModTime()
		}
	}
	if path == "" {
		http.Error(w, fmt.Sprintf("no log of container %s in pod %s/%s", container, ns, pod), http.StatusNotFound)
		return
	}
	f, err := os.Open(path)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "text/plain")
	if n, err := strconv.Atoi(r.URL.Query().Get("tailLines")); err == nil && n >= 0 {
		b, err := io.ReadAll(f)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		lines := strings.SplitAfter(string(b), "\n")
		if len(lines) > 0 && lines[len(lines)-1] == "" {
			lines = lines[:len(lines)-1]
		}
		if len(lines) > n {
			lines = lines[len(lines)-n:]
		}
		_, _ = io.WriteString(w, strings.Join(lines, ""))
	} else if _, err := io.Copy(w, f); err != nil {
		return
	}
	if r.URL.Query().Get("follow") != "true" {
		return
	}
	fl, _ := w.(http.Flusher)
	for {
		if fl != nil {
			fl.Flush()
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
		if _, err := io.Copy(w, f); err != nil {
			return
		}
	}
}

// selfSignedCert is a kubelet's serving certificate (the apiserver does not
// verify kubelets' certificates unless told to).
func selfSignedCert(name string, ip interface{ AsSlice() []byte }) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{name},
		IPAddresses:  []net.IP{net.IP(ip.AsSlice())},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
