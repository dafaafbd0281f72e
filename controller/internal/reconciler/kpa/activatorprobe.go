package kpa

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/sockscale/sockscale/internal/activatorprobe"
)

// ResolvePublic returns the address ("ip:port") that clients of a public
// Service dial: its ClusterIP and port (the PodAutoscaler's
// spec.service.port, 0 if it sets none).
type ResolvePublic func(ctx context.Context, namespace, service string, port int32) (string, error)

// HTTPProber is the Prober that sends the activator probe
// (internal/activatorprobe) to public Services.
type HTTPProber struct {
	Resolve ResolvePublic
	// Timeout bounds one probe (default 1 s).
	Timeout time.Duration
	// Client defaults to one that keeps no idle connections: each probe
	// must take the path a new client connection takes. Whatever the
	// client, redirects are never followed: the public Service's pods are
	// a tenant's, and a redirect would have the controller send requests
	// wherever they say.
	Client *http.Client
}

// ActivatorInPath sends one probe to the public Service's port and
// reports whether an activator answered it.
func (p *HTTPProber) ActivatorInPath(ctx context.Context, namespace, service string, port int32) (bool, error) {
	addr, err := p.Resolve(ctx, namespace, service, port)
	if err != nil {
		return false, fmt.Errorf("resolve Service %s/%s: %w", namespace, service, err)
	}
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
	if err != nil {
		return false, err
	}
	req.Header.Set(activatorprobe.Header, activatorprobe.Value)
	req.Header.Set("User-Agent", activatorprobe.UserAgent)
	client := http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	if p.Client != nil {
		client = *p.Client
	}
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := client.Do(req)
	if err != nil {
		return false, fmt.Errorf("probe %s/%s at %s: %w", namespace, service, addr, err)
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK && resp.Header.Get(activatorprobe.ResponseHeader) != "", nil
}
