package resolve

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

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
//     - "name" alone (no dot) resolves to nothing, whatever exists: a
//     client's search path made it name.<the client's namespace>, which
//     the activator serving every namespace cannot know; taking the one
//     namespace that has such a target would let another tenant turn
//     working calls into 404s by creating a namesake (or, picking one,
//     send them to the wrong tenant). The 404 says to use name.<namespace>.
//     Knative's ingresses do not route short names either. Route hosts
//     of one label are not looked up either: one would catch the bare-name
//     calls of every other namespace's clients.
//     For these Service forms a port, when given, must be one of the
//     Service's ports: a client that reached the Service used one of them.
//     No port is not checked (80 is implied, and clients that set Host by
//     hand often leave it out).
//  3. further host names registered for a target (HTTPRoute and Ingress
//     hosts, which the watcher gives only by its rules of host claims:
//     watch/routes.go); their port is not checked: it is the gateway's,
//     not the Service's. A host registered by several targets (a route
//     that splits traffic between two public Services) is ambiguous: such
//     routes must set Sockscale-Target per backend.
//
// The same forms (and a Sockscale-Target header naming one) name a
// serving Route's Services (RouteService): the request then goes to a
// revision of the Route, chosen as routes.go describes, and from there on
// it is that revision's.
type Table struct {
	domain string // lower case, no trailing dot
	// intN draws uniformly from [0, n) for the routes' weighted choice
	// (rand.Int64N; a seeded source in tests).
	intN func(n int64) int64
	// now is the clock of serveSince (time.Now; a fake in tests).
	now func() time.Time

	mu sync.RWMutex
	// readyPods says how many ready pods a target has, as the throttle
	// knows them (nil: the table does not know; see SetReadyPods).
	readyPods func(target.Key) int
	targets   map[target.Key]*target.Target
	// Routes by their key, and their address Services by the Service's
	// key. A Service key is a target's or a RouteService's, never both.
	routes   map[target.Key]*Route
	services map[target.Key]*RouteService
	// Indexes over the Services of both targets and RouteServices.
	ips   map[netip.Addr]target.Key // ClusterIP -> Service
	hosts map[string][]target.Key   // extra host -> Services registering it
	// serveSince holds, for each target in Serve mode, when an Upsert
	// first said so after one that did not (ServeSince).
	serveSince map[target.Key]time.Time
}

// NewTable returns an empty table for Services under clusterDomain ("" is
// DefaultClusterDomain).
func NewTable(clusterDomain string) *Table {
	d := normalizeHost(clusterDomain)
	if d == "" {
		d = DefaultClusterDomain
	}
	return &Table{
		domain:     d,
		intN:       rand.Int64N,
		now:        time.Now,
		targets:    make(map[target.Key]*target.Target),
		routes:     make(map[target.Key]*Route),
		services:   make(map[target.Key]*RouteService),
		ips:        make(map[netip.Addr]target.Key),
		hosts:      make(map[string][]target.Key),
		serveSince: make(map[target.Key]time.Time),
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
	for i, ip := range c.ClusterIPs {
		c.ClusterIPs[i] = ip.Unmap()
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	since, serving := tb.serveSince[t.Key]
	tb.forget(t.Key)
	tb.targets[t.Key] = &c
	tb.index(c.Key, c.ClusterIPs, c.Hosts)
	if c.Serve {
		if !serving {
			since = tb.now()
		}
		tb.serveSince[t.Key] = since
	}
	return nil
}

// ServeSince says since when target k has been in Serve mode
// (target.Target.Serve) without a break, as this table learnt it: from
// the first Upsert that said Serve after one that did not (or after k was
// no target). False while k is in any other mode, or is no target.
func (tb *Table) ServeSince(k target.Key) (time.Time, bool) {
	tb.mu.RLock()
	defer tb.mu.RUnlock()
	since, ok := tb.serveSince[k]
	return since, ok
}

// Delete removes the Service with key k, if any: a target's public
// Service or a Route's Service.
func (tb *Table) Delete(k target.Key) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.forget(k)
}

// forget removes the Service k, a target's or a RouteService's, and its
// index entries. tb.mu must be held.
func (tb *Table) forget(k target.Key) {
	if t, ok := tb.targets[k]; ok {
		tb.unindex(k, t.ClusterIPs, t.Hosts)
		delete(tb.targets, k)
		delete(tb.serveSince, k)
	}
	if s, ok := tb.services[k]; ok {
		tb.unindex(k, s.ClusterIPs, s.Hosts)
		delete(tb.services, k)
	}
}

// index adds the Service k to the secondary indexes. tb.mu must be held.
func (tb *Table) index(k target.Key, ips []netip.Addr, hosts []string) {
	for _, ip := range ips {
		tb.ips[ip] = k
	}
	for _, h := range hosts {
		tb.hosts[h] = append(tb.hosts[h], k)
	}
}

// unindex removes the Service k from the secondary indexes. tb.mu must be
// held.
func (tb *Table) unindex(k target.Key, ips []netip.Addr, hosts []string) {
	for _, ip := range ips {
		// A ClusterIP moves to another Service only when a Service was
		// deleted and its address reused: keep the newer owner.
		if tb.ips[ip] == k {
			delete(tb.ips, ip)
		}
	}
	for _, h := range hosts {
		removeKey(tb.hosts, h, k)
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
// header value (may be empty) and host (r.Host) is for; a host naming a
// Route chooses among all its revisions (AllRevisions). The result is
// shared: callers must not modify it.
func (tb *Table) Resolve(header, host string) (*target.Target, error) {
	return tb.resolve(header, host, AllRevisions)
}

// ResolveHost returns the target that host ("name[:port]", "ip[:port]")
// reaches, in the order Table describes (AllRevisions for a Route).
func (tb *Table) ResolveHost(host string) (*target.Target, error) {
	return tb.resolveHost(host, AllRevisions)
}

func (tb *Table) resolve(header, host string, pick Pick) (*target.Target, error) {
	if header != "" {
		k, err := target.ParseKey(header)
		if err != nil {
			return nil, fmt.Errorf("%w: %s %q: want <namespace>/<name> of a public Service", ErrBadHeader, Header, header)
		}
		tb.mu.RLock()
		defer tb.mu.RUnlock()
		if t := tb.targets[k]; t != nil {
			return t, nil
		}
		if s := tb.services[k]; s != nil {
			return tb.pickRevision(s, fmt.Sprintf("%s %q", Header, header), pick)
		}
		return nil, fmt.Errorf("%w: %s %q names no target this activator knows", ErrNotFound, Header, header)
	}
	if host == "" {
		return nil, fmt.Errorf("%w: the request has neither a %s header nor a host", ErrNotFound, Header)
	}
	return tb.resolveHost(host, pick)
}

func (tb *Table) resolveHost(host string, pick Pick) (*target.Target, error) {
	tb.mu.RLock()
	defer tb.mu.RUnlock()
	k, port, err := tb.service(host)
	if err != nil {
		return nil, err
	}
	if t := tb.targets[k]; t != nil {
		return tb.withPort(t, host, port)
	}
	s := tb.services[k]
	if err := s.checkPort(host, port); err != nil {
		return nil, err
	}
	return tb.pickRevision(s, fmt.Sprintf("host %q", host), pick)
}

// Reaches says whether host, resolved as Resolve does, can lead to the
// target k: it names k's public Service, or a Route's Service whose
// choice may be k (for a Route's own address, any of its revisions with
// percent > 0; for a tag's, the tag's revision).
func (tb *Table) Reaches(host string, k target.Key) bool {
	tb.mu.RLock()
	defer tb.mu.RUnlock()
	sk, port, err := tb.service(host)
	if err != nil {
		return false
	}
	if t := tb.targets[sk]; t != nil {
		_, err := tb.withPort(t, host, port)
		return err == nil && sk == k
	}
	s := tb.services[sk]
	if s.checkPort(host, port) != nil || k.Namespace != s.Key.Namespace {
		return false
	}
	return slices.Contains(tb.revisions(s), k.Name)
}

// service returns the key of the Service, a target's or a RouteService's,
// that host names, and the port to check (0: none). tb.mu must be held.
func (tb *Table) service(host string) (target.Key, uint16, error) {
	name, port, err := splitHostPort(host)
	if err != nil {
		return target.Key{}, 0, fmt.Errorf("%w: host %q: %w", ErrNotFound, host, err)
	}
	if ip, err := netip.ParseAddr(name); err == nil {
		k, ok := tb.ips[ip.Unmap()]
		if !ok {
			return target.Key{}, 0, fmt.Errorf("%w: host %q: %s is not the ClusterIP of any target's public Service or of a Route's Service", ErrNotFound, host, ip)
		}
		return k, port, nil
	}

	labels := strings.Split(name, ".")
	if len(labels) == 1 {
		return target.Key{}, 0, fmt.Errorf("%w: host %q has no namespace: the activator serves every namespace and cannot know the client's, so a name alone never resolves; use %s.<namespace> (or %s.<namespace>.svc.%s) or the %s header",
			ErrNotFound, host, name, name, tb.domain, Header)
	}
	if rest := strings.Join(labels[2:], "."); rest == "" || rest == "svc" || rest == "svc."+tb.domain {
		k := target.Key{Namespace: labels[1], Name: labels[0]}
		if tb.targets[k] != nil || tb.services[k] != nil {
			return k, port, nil
		}
	}

	switch keys := tb.hosts[name]; len(keys) {
	case 0:
		return target.Key{}, 0, fmt.Errorf("%w: host %q matches no target: tried ClusterIPs, Service names (name.ns, name.ns.svc, name.ns.svc.%s) and route hosts, of targets and of Routes",
			ErrNotFound, host, tb.domain)
	case 1:
		// The port of an extra host is the gateway's: not checked.
		return keys[0], 0, nil
	default:
		return target.Key{}, 0, fmt.Errorf("%w: host %q is a route host of targets %s; a route that splits traffic must set the %s header per backend",
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

func keyList(keys []target.Key) string {
	s := make([]string, len(keys))
	for i, k := range keys {
		s[i] = k.String()
	}
	slices.Sort(s)
	return strings.Join(s, ", ")
}
