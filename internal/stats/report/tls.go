package report

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"
)

// SetCAFile makes the reporter post over HTTPS, trusting the CA
// certificates (PEM) in path for the controller's serving certificate,
// which must name the target's host (the Service: the addresses it
// resolves to are dialled, the name is verified). The file is read now,
// and again whenever it changes, so a renewed CA in a mounted Secret is
// taken without a restart. Call it before Run.
func (r *Reporter) SetCAFile(path string) error {
	t := &caTrust{path: path, serverName: r.host}
	if _, err := t.client(); err != nil {
		return err
	}
	r.tls = t
	return nil
}

// caTrust is an HTTPS client that trusts the CA in a file, remade when the
// file changes.
type caTrust struct {
	path, serverName string
	mu               sync.Mutex
	modTime          time.Time
	size             int64
	c                *http.Client
}

func (t *caTrust) client() (*http.Client, error) {
	fi, err := os.Stat(t.path)
	if err != nil {
		return nil, fmt.Errorf("controller CA %s: %w", t.path, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.c != nil && fi.ModTime().Equal(t.modTime) && fi.Size() == t.size {
		return t.c, nil
	}
	pem, err := os.ReadFile(t.path)
	if err != nil {
		return nil, fmt.Errorf("controller CA %s: %w", t.path, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("controller CA %s: no PEM certificate in it", t.path)
	}
	if t.c != nil {
		t.c.CloseIdleConnections()
	}
	t.c = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, IdleConnTimeout: time.Minute,
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: t.serverName, MinVersion: tls.VersionTLS12}}}
	t.modTime, t.size = fi.ModTime(), fi.Size()
	return t.c, nil
}
