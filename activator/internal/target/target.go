package target

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Key names a target by the namespace and name of its public Service: the
// Service clients call (a PodAutoscaler's spec.service.name).
type Key struct{ Namespace, Name string }

func (k Key) String() string { return k.Namespace + "/" + k.Name }

// ParseKey reads "<namespace>/<name>": a namespace (DNS-1123 label) and
// a Service name (DNS-1035 label); nothing else can name a target.
func ParseKey(s string) (Key, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1035Label(name)) > 0 {
		return Key{}, fmt.Errorf("target %q: want <namespace>/<name>, a namespace and a Service name", s)
	}
	return Key{Namespace: ns, Name: name}, nil
}

// Request timeouts, as Knative's timeoutSeconds: a request may be held and
// answered within this long.
const (
	DefaultTimeout = 300 * time.Second
	MaxTimeout     = 600 * time.Second
)

// Target is what the activator knows of one target. The wiring builds it
// from the PodAutoscaler, its public Service and the routes naming it.
type Target struct {
	Key Key
	// ClusterIPs of the public Service (one per IP family); empty for a
	// headless Service.
	ClusterIPs []netip.Addr
	// Ports of the public Service. A Host that names the Service with a
	// port must name one of these; empty: any port.
	Ports []uint16
	// ContainerConcurrency is the most requests a pod takes at once; 0 is
	// unlimited.
	ContainerConcurrency int
	// Timeout bounds a request from arrival to the end of its response,
	// holding included; 0 means DefaultTimeout.
	Timeout time.Duration
	// Hosts are further host names that reach the target: those of
	// HTTPRoutes and Ingresses whose backend is its public Service.
	Hosts []string
	// H2C: the pods speak HTTP/2 without TLS (the Service port's
	// appProtocol is kubernetes.io/h2c), so requests go to them as h2c.
	H2C bool
	// Proxy: the target's ServerlessService status says Proxy mode (its
	// public endpoints are activators). A Route's proxy-port requests
	// choose among such revisions first (resolve.ProxiedFirst).
	Proxy bool
	// ColdStartHeader: a pod's response to a request held through a cold
	// start says so (v1alpha1.ColdStartHeader).
	ColdStartHeader bool
	// QueueDepth bounds the requests held for the target (capped by the
	// activator's own); 0: the activator's.
	QueueDepth int
	// HealthChecks, if set, are requests the activator answers itself
	// while the target has no ready pod.
	HealthChecks *HealthChecks
	// Serve: the ServerlessService's spec and status both say Serve mode
	// and it is Ready, so its public endpoints are the target's ready pods
	// and a client connecting to the public Service reaches them without
	// an activator. Neither Proxy nor Serve: no ServerlessService of its
	// own yet, no mode in its status yet, not Ready, or on its way from
	// Serve to Proxy.
	Serve bool
}

// HealthChecks says which requests are health checks (a GET or HEAD
// whose path is one of Paths, if any, and whose User-Agent contains one
// of UserAgents, if any) and the status they are answered with.
type HealthChecks struct {
	Paths, UserAgents []string
	Status            int
}

// Matches says whether r is a health check.
func (h *HealthChecks) Matches(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	if len(h.Paths) > 0 && !slices.Contains(h.Paths, r.URL.Path) {
		return false
	}
	if len(h.UserAgents) > 0 {
		ua := r.UserAgent()
		if !slices.ContainsFunc(h.UserAgents, func(s string) bool { return strings.Contains(ua, s) }) {
			return false
		}
	}
	return true
}

// RequestTimeout is t.Timeout with the default applied.
func (t *Target) RequestTimeout() time.Duration {
	if t.Timeout == 0 {
		return DefaultTimeout
	}
	return t.Timeout
}

// Validate says what is wrong with t, naming each field, value and range.
func (t *Target) Validate() error {
	var errs []error
	if t.Key.Namespace == "" || t.Key.Name == "" {
		errs = append(errs, fmt.Errorf("key %q: namespace and name must both be set", t.Key))
	}
	if t.ContainerConcurrency < 0 {
		errs = append(errs, fmt.Errorf("containerConcurrency %d: must be 0 (unlimited) or more", t.ContainerConcurrency))
	}
	if h := t.HealthChecks; h != nil {
		if len(h.Paths) == 0 && len(h.UserAgents) == 0 {
			errs = append(errs, errors.New("healthChecks: needs paths, userAgents or both"))
		}
		if h.Status < 200 || h.Status > 599 {
			errs = append(errs, fmt.Errorf("healthChecks.status %d: must be from 200 to 599", h.Status))
		}
	}
	if t.QueueDepth < 0 {
		errs = append(errs, fmt.Errorf("queueDepth %d: must be 0 (the activator's) or more", t.QueueDepth))
	}
	if t.Proxy && t.Serve {
		errs = append(errs, errors.New("proxy and serve: a target is in one mode at most"))
	}
	if t.Timeout < 0 || t.Timeout > MaxTimeout {
		errs = append(errs, fmt.Errorf("timeout %v: must be from 0 (default %v) to %v", t.Timeout, DefaultTimeout, MaxTimeout))
	}
	for _, ip := range t.ClusterIPs {
		if !ip.IsValid() {
			errs = append(errs, errors.New("clusterIPs: holds an invalid address"))
			break
		}
	}
	for _, p := range t.Ports {
		if p == 0 {
			errs = append(errs, errors.New("ports: port 0 is not a port"))
			break
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("target %s: %w", t.Key, err)
	}
	return nil
}
