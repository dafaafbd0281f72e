package resolve

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/sockscale/sockscale/activator/internal/target"
)

// Header names the target explicitly: "<namespace>/<name>" of its public
// Service. It wins over the host; an ingress or a client that knows the
// target sets it.
const Header = "Sockscale-Target"

// DefaultClusterDomain is the DNS domain of Services unless configured.
const DefaultClusterDomain = "cluster.local"

// Errors of Resolve, checked with errors.Is. Each returned error says what
// was tried, so a 404 body built from it tells the client why.
var (
	// ErrNotFound: nothing names a known target.
	ErrNotFound = errors.New("no such target")
	// ErrAmbiguous: the host names several targets.
	ErrAmbiguous = errors.New("ambiguous target")
	// ErrBadHeader: the Sockscale-Target header is not "<namespace>/<name>".
	ErrBadHeader = errors.New("malformed " + Header + " header")
)

// Table maps what requests carry to targets. The wiring keeps it equal to
// the cluster (Upsert, Delete); request handlers read it concurrently.
//
// Resolution order, first match wins:
//  1. the Sockscale-Target header, "<namespace>/<name>"; when present it is
//     the only thing tried (an explicit name that is wrong is an error, not
//     a hint to guess from the host);
//  2. the host (Host header, or :authority in HTTP/2), case-insensitive,
//     with or without a trailing dot, with or without ":port":
//     - a ClusterIP of a public Service;
//     - "name.ns", "name.ns.svc", "name.ns.svc.<cluster-domain>";
//     - "name" alone: the activator cannot know the client's namespace
//     (search paths are the client's), so a bare name resolves only when
//     exactly one namespace has a target of that name, otherwise the
//     request gets a 404 saying which namespaces have it;
//     For these Service forms a port, when given, must be one of the
//     Service's ports: a client that reached the Service used one of them.
//     No port is not checked (80 is implied, and clients that set Host by
//     hand often leave it out).
//  3. further host names registered for a target (HTTPRoute and Ingress
//     hosts); their port is not checked: it is the gateway's, not the
//     Service's. A host registered by several targets (a route that
//     splits traffic between two public Services) is ambiguous: such
//     routes must set Sockscale-Target per backend.
type Table struct {
	domain string // lower case, no trailing dot

	mu      sync.RWMutex
	targets map[target.Key]*target.Target
	names   map[string][]target.Key   // bare Service name -> targets with it
	ips     map[netip.Addr]target.Key // ClusterIP -> target
	hosts   map[string][]target.Key   // extra host -> targets registering it
}

// NewTable returns an empty table for Services under clusterDomain ("" is
// DefaultClusterDomain).
func NewTable(clusterDomain string) *Table {
	d := normalizeHost(clusterDomain)
	if d == "" {
		d = DefaultClusterDomain
	}
	return &Table{
		domain:  d,
		targets: make(map[target.Key]*target.Target),
		names:   make(map[string][]target.Key),
		ips:     make(map[netip.Addr]target.Key),
		hosts:   make(map[string][]target.Key),
	}
}

// Upsert adds t or replaces the target with its key. The table keeps its
// own copy.
func (tb *Table) Upsert(t target.Target) error {
	if err := t.Validate(); err != nil {
		return fmt.Errorf("upsert: %w", err)
	}
	c := t
	c.ClusterIPs = slices.Clone(t.ClusterIPs)
	c.Ports = slices.Clone(t.Ports)
	c.Hosts = nil
	for _, h := range t.Hosts {
		if h = normalizeHost(h); h != "" && !slices.Contains(c.Hosts, h) {
			c.Hosts = append(c.Hosts, h)
		}
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if old, ok := tb.targets[t.Key]; ok {
		tb.unindex(old)
	}
	tb.targets[t.Key] = &c
	tb.names[c.Key.Name] = append(tb.names[c.Key.Name], c.Key)
	for i, ip := range c.ClusterIPs {
		c.ClusterIPs[i] = ip.Unmap()
		tb.ips[ip.Unmap()] = c.Key
	}
	for _, h := range c.Hosts {
		tb.hosts[h] = append(tb.hosts[h], c.Key)
	}
	return nil
}

// Delete removes the target with key k, if any.
func (tb *Table) Delete(k target.Key) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if old, ok := tb.targets[k]; ok {
		tb.unindex(old)
		delete(tb.targets, k)
	}
}

// unindex removes t from the secondary indexes. tb.mu must be held.
func (tb *Table) unindex(t *target.Target) {
	removeKey(tb.names, t.Key.Name, t.Key)
	for _, ip := range t.ClusterIPs {
		// A ClusterIP moves to another target only when a Service was
		// deleted and its address reused: keep the newer owner.
		if tb.ips[ip] == t.Key {
			delete(tb.ips, ip)
		}
	}
	for _, h := range t.Hosts {
		removeKey(tb.hosts, h, t.Key)
	}
}

func removeKey(m map[string][]target.Key, s string, k target.Key) {
	keys := slices.DeleteFunc(m[s], func(x target.Key) bool { return x == k })
	if len(keys) == 0 {
		delete(m, s)
	} else {
		m[s] = keys
	}
}

// Len is the number of targets.
func (tb *Table) Len() int {
	tb.mu.RLock()
	defer tb.mu.RUnlock()
	return len(tb.targets)
}

// Resolve returns the target that a request with this Sockscale-Target
// header value (may be empty) and host (r.Host) is for. The result is
// shared: callers must not modify it.
func (tb *Table) Resolve(header, host string) (*target.Target, error) {
	if header != "" {
		k, err := target.ParseKey(header)
		if err != nil {
			return nil, fmt.Errorf("%w: %s %q: want <namespace>/<name> of a public Service", ErrBadHeader, Header, header)
		}
		tb.mu.RLock()
		t := tb.targets[k]
		tb.mu.RUnlock()
		if t == nil {
			return nil, fmt.Errorf("%w: %s %q names no target this activator knows", ErrNotFound, Header, header)
		}
		return t, nil
	}
	if host == "" {
		return nil, fmt.Errorf("%w: the request has neither a %s header nor a host", ErrNotFound, Header)
	}
	return tb.ResolveHost(host)
}

// ResolveHost returns the target that host ("name[:port]", "ip[:port]")
// reaches, in the order Table describes.
func (tb *Table) ResolveHost(host string) (*target.Target, error) {
	name, port, err := splitHostPort(host)
	if err != nil {
		return nil, fmt.Errorf("%w: host %q: %w", ErrNotFound, host, err)
	}
	tb.mu.RLock()
	defer tb.mu.RUnlock()

	if ip, err := netip.ParseAddr(name); err == nil {
		k, ok := tb.ips[ip.Unmap()]
		if !ok {
			return nil, fmt.Errorf("%w: host %q: %s is not the ClusterIP of any target's public Service", ErrNotFound, host, ip)
		}
		return tb.withPort(tb.targets[k], host, port)
	}

	labels := strings.Split(name, ".")
	if len(labels) == 1 {
		switch keys := tb.names[name]; len(keys) {
		case 0:
			// Not a Service name: perhaps a route's host.
		case 1:
			return tb.withPort(tb.targets[keys[0]], host, port)
		default:
			return nil, fmt.Errorf("%w: host %q is the Service name of targets in namespaces %s; the activator cannot know the client's namespace: use %s.<namespace> or the %s header",
				ErrAmbiguous, host, namespaces(keys), name, Header)
		}
	} else if rest := strings.Join(labels[2:], "."); rest == "" || rest == "svc" || rest == "svc."+tb.domain {
		if t := tb.targets[target.Key{Namespace: labels[1], Name: labels[0]}]; t != nil {
			return tb.withPort(t, host, port)
		}
	}

	switch keys := tb.hosts[name]; len(keys) {
	case 0:
		return nil, fmt.Errorf("%w: host %q matches no target: tried ClusterIPs, Service names (name, name.ns, name.ns.svc, name.ns.svc.%s) and route hosts",
			ErrNotFound, host, tb.domain)
	case 1:
		return tb.targets[keys[0]], nil
	default:
		return nil, fmt.Errorf("%w: host %q is a route host of targets %s; a route that splits traffic must set the %s header per backend",
			ErrAmbiguous, host, keyList(keys), Header)
	}
}

// withPort returns t if port (0: none given) is one of its Service's ports.
func (tb *Table) withPort(t *target.Target, host string, port uint16) (*target.Target, error) {
	if port == 0 || len(t.Ports) == 0 || slices.Contains(t.Ports, port) {
		return t, nil
	}
	return nil, fmt.Errorf("%w: host %q names the public Service of %s, whose ports are %v, not %d", ErrNotFound, host, t.Key, t.Ports, port)
}

// splitHostPort splits a Host value into a normalized host (lower case,
// no trailing dot, no IPv6 brackets) and its port (0 when absent).
func splitHostPort(hostport string) (string, uint16, error) {
	host, portStr := hostport, ""
	// A colon outside an IPv6 literal separates the port: "h:80",
	// "[::1]:80"; "[::1]" and a bare "::1" have none.
	if (strings.HasPrefix(hostport, "[") && !strings.HasSuffix(hostport, "]")) || strings.Count(hostport, ":") == 1 {
		h, p, err := net.SplitHostPort(hostport)
		if err != nil {
			return "", 0, err
		}
		host, portStr = h, p
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	host = normalizeHost(host)
	if host == "" {
		return "", 0, errors.New("empty host name")
	}
	if portStr == "" {
		return host, 0, nil
	}
	p, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || p == 0 {
		return "", 0, fmt.Errorf("port %q is not a number from 1 to 65535", portStr)
	}
	return host, uint16(p), nil
}

func normalizeHost(h string) string {
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

func namespaces(keys []target.Key) string {
	ns := make([]string, len(keys))
	for i, k := range keys {
		ns[i] = k.Namespace
	}
	slices.Sort(ns)
	return strings.Join(ns, ", ")
}

func keyList(keys []target.Key) string {
	s := make([]string, len(keys))
	for i, k := range keys {
		s[i] = k.String()
	}
	slices.Sort(s)
	return strings.Join(s, ", ")
}
