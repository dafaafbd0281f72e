package certfile

import (
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"
)

// checkInterval is how often the files are looked at again: a renewed
// Secret reaches the mounted files within the kubelet's sync (about a
// minute), so checking more often buys nothing.
const checkInterval = 10 * time.Second

// Pair is a key pair read from certFile and keyFile (PEM).
type Pair struct {
	certFile, keyFile string
	mu                sync.Mutex
	cert              *tls.Certificate
	stamp             string
	checked           time.Time
}

// Load reads the pair once, so a bad pair fails the start.
func Load(certFile, keyFile string) (*Pair, error) {
	p := &Pair{certFile: certFile, keyFile: keyFile}
	if _, err := p.GetCertificate(nil); err != nil {
		return nil, err
	}
	return p, nil
}

// GetCertificate is tls.Config.GetCertificate. A pair that no longer
// loads keeps the previous one in service (the files may be mid-update).
func (p *Pair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cert != nil && time.Since(p.checked) < checkInterval {
		return p.cert, nil
	}
	p.checked = time.Now()
	stamp, err := p.stampNow()
	if err == nil && stamp == p.stamp {
		return p.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(p.certFile, p.keyFile)
	if err != nil {
		if p.cert != nil {
			return p.cert, nil
		}
		return nil, fmt.Errorf("serving certificate %s, key %s: %w", p.certFile, p.keyFile, err)
	}
	p.cert, p.stamp = &cert, stamp
	return p.cert, nil
}

func (p *Pair) stampNow() (string, error) {
	var s string
	for _, f := range []string{p.certFile, p.keyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return "", err
		}
		s += fmt.Sprintf("%d/%d;", fi.ModTime().UnixNano(), fi.Size())
	}
	return s, nil
}
