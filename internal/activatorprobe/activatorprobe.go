package activatorprobe

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"
)

// The probe protocol. The controller sends GET / with Header: Value and a
// User-Agent starting with "sockscale-probe/" (so the agents do not count
// it as load); an activator answers 200 with ResponseHeader set to its pod
// name without forwarding the request. Anything else (a pod's own answer,
// a refused connection) means the activator is not in the path yet.
const (
	Header         = "Sockscale-Probe"
	Value          = "activator"
	ResponseHeader = "Sockscale-Activator"
	UserAgent      = "sockscale-probe/activator"
)

// IsProbe says whether r is an activator probe.
func IsProbe(r *http.Request) bool { return r.Header.Get(Header) == Value }

// Resolve returns the address ("ip:port") that clients of a public Service
// dial: its ClusterIP and port.
type Resolve func(ctx context.Context, namespace, service string) (string, error)

// Prober probes public Services.
type Prober struct {
	Resolve Resolve
	// Timeout bounds one probe (default 1 s).
	Timeout time.Duration
	// Client defaults to one that keeps no idle connections: each probe
	// must take the path a new client connection takes.
	Client *http.Client
}

// ActivatorInPath sends one probe to the public Service and reports
// whether an activator answered it.
func (p *Prober) ActivatorInPath(ctx context.Context, namespace, service string) (bool, error) {
	addr, err := p.Resolve(ctx, namespace, service)
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
	req.Header.Set(Header, Value)
	req.Header.Set("User-Agent", UserAgent)
	client := p.Client
	if client == nil {
		client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, fmt.Errorf("probe %s/%s at %s: %w", namespace, service, addr, err)
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK && resp.Header.Get(ResponseHeader) != "", nil
}

// HostPort joins an IP and port for a Resolve.
func HostPort(ip string, port int32) string {
	return net.JoinHostPort(ip, strconv.Itoa(int(port)))
}
