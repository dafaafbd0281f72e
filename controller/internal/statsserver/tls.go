package statsserver

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"
)

// certCheckInterval is how often the serving certificate's files are
// looked at again: a renewed Secret reaches the mounted files within the
// kubelet's sync (about a minute), so checking more often buys nothing.
const certCheckInterval = 10 * time.Second

// certFiles serves a key pair from files and loads it again when they
// change, so a renewed certificate needs no restart.
type certFiles struct {
	certFile, keyFile string
	mu                sync.Mutex
	cert              *tls.Certificate
	stamp             string
	checked           time.Time
}

// newCertFiles loads the pair once, so a bad pair fails the start.
func newCertFiles(certFile, keyFile string) (*certFiles, error) {
	c := &certFiles{certFile: certFile, keyFile: keyFile}
	if _, err := c.get(nil); err != nil {
		return nil, err
	}
	return c, nil
}

// get is tls.Config.GetCertificate. A pair that no longer loads keeps the
// previous one in service (the files may be mid-update).
func (c *certFiles) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert != nil && time.Since(c.checked) < certCheckInterval {
		return c.cert, nil
	}
	c.checked = time.Now()
	stamp, err := c.stampNow()
	if err == nil && stamp == c.stamp {
		return c.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		if c.cert != nil {
			return c.cert, nil
		}
		return nil, fmt.Errorf("stats serving certificate %s, key %s: %w", c.certFile, c.keyFile, err)
	}
	c.cert, c.stamp = &cert, stamp
	return c.cert, nil
}

func (c *certFiles) stampNow() (string, error) {
	var s string
	for _, f := range []string{c.certFile, c.keyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return "", err
		}
		s += fmt.Sprintf("%d/%d;", fi.ModTime().UnixNano(), fi.Size())
	}
	return s, nil
}
