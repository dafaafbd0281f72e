package kedascaler

import (
	"crypto/x509"
	"fmt"
	"os"
	"sync"
	"time"
)

// caCheckInterval is how often the client CA file is looked at again, as
// internal/certfile does for the serving pair: a renewed Secret reaches
// the mounted file within the kubelet's sync (about a minute).
const caCheckInterval = 10 * time.Second

// clientCAs is the pool of CA certificates that sign KEDA's client
// certificate, read from a PEM file and read again when it changes, so
// that a rotated CA needs no restart.
type clientCAs struct {
	file    string
	mu      sync.Mutex
	current *x509.CertPool
	stamp   string // the file's modification time and size when read
	checked time.Time
}

// loadClientCAs reads file once, so a bad file fails the start.
func loadClientCAs(file string) (*clientCAs, error) {
	c := &clientCAs{file: file}
	if err := c.read(); err != nil {
		return nil, err
	}
	return c, nil
}

// pool is the pool as the file is now. A file that no longer reads keeps
// the previous pool in service (it may be mid-update).
func (c *clientCAs) pool() *x509.CertPool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.checked) >= caCheckInterval {
		_ = c.read() // on error the previous pool serves
	}
	return c.current
}

// read loads the file if it changed since it was last read. Its stamp is
// taken first, so a change while reading is seen at the next check.
func (c *clientCAs) read() error {
	c.checked = time.Now()
	fi, err := os.Stat(c.file)
	if err != nil {
		return fmt.Errorf("client CA file: %w", err)
	}
	stamp := fmt.Sprintf("%d/%d", fi.ModTime().UnixNano(), fi.Size())
	if stamp == c.stamp {
		return nil
	}
	pem, err := os.ReadFile(c.file)
	if err != nil {
		return fmt.Errorf("client CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("client CA file %s: no PEM certificate in it", c.file)
	}
	c.current, c.stamp = pool, stamp
	return nil
}
