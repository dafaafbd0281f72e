package resolve

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/sockscale/sockscale/activator/internal/target"
)

// Routes of the serving API (serving.sockscale.dev Route). A Route splits
// traffic across Revisions by percent; each Revision's public Service is
// an ordinary target. The controller gives a Route Kubernetes Services
// (RouteService): its own address, <route>, and one per tag,
// <tag>-<route>. Their hosts resolve here in every form a public
// Service's does (name, name.ns, name.ns.svc, name.ns.svc.<domain>, with
// or without port, the ClusterIP:port, and Ingress/HTTPRoute hosts whose
// backend is the Service); the revision chosen then takes the ordinary
// path of its target (hold, wake, forward, capacity).
//
// A tag's Service always means the tag's revision, whatever its percent.
// The Route's own address chooses one of the revisions with percent > 0,
// weighted by percent, per request; how depends on the port the request
// came to (Pick).

// Pick says how a request for a Route's own address chooses its revision.
type Pick int

const (
	// ProxiedFirst is the proxy port's choice. A Route's host reaches it
	// only through a node agent's kernel split: the kernel chose a
	// revision by percent, and that revision, being in Proxy mode, sent
	// the connect to an activator. So the activator chooses among the
	// revisions whose activator is in the path (Proxied), weighted by
	// percent; a revision at 30 % of a 50/30/20 split whose 30 % and
	// 20 % are proxied then gets 30/(30+20) = 60 % of what arrives here,
	// which is 60 % of 50 %, its 30 % overall. When none is proxied as
	// this activator sees it (a status not seen yet), it chooses among
	// all, as AllRevisions. Exact in expectation when the proxied
	// revisions have the same activators in their paths (as with the
	// default two); with different subsets a revision's connects reach
	// this activator at percent / (its activators), which is not
	// weighted for here.
	ProxiedFirst Pick = iota
	// AllRevisions is the route port's choice: requests arrive there
	// through the Route Service's EndpointSlices (nodes without the
	// agent, clients outside the cluster), with no split made before, so
	// the activator makes all of it: every revision with percent > 0,
	// weighted by percent.
	AllRevisions
)

func (p Pick) String() string {
	if p == AllRevisions {
		return "all revisions"
	}
	return "proxied revisions first"
}

// Errors of a Route's choice, checked with errors.Is; the message names
// the Route and why.
var (
	// ErrRouteNotReady: the host names a Route, or a tag of it, whose
	// status.traffic does not say (yet) where the request goes.
	ErrRouteNotReady = errors.New("route not ready")
	// ErrRevisionUnknown: the Route's revision chosen for the request is
	// no target this activator knows. Nothing is sent elsewhere.
	ErrRevisionUnknown = errors.New("route's revision unknown")
)

// Route is the split in effect of a serving Route: its status.traffic.
type Route struct {
	// Key is the Route's namespace and name.
	Key target.Key
	// Traffic is status.traffic; empty: the controller has not resolved
	// the Route yet.
	Traffic []Traffic
}

// Traffic is one entry of a Route's status.traffic.
type Traffic struct {
	// Revision is the revision's name: its public Service's and target's
	// name, in the Route's namespace.
	Revision string
	Tag      string
	// Percent of the Route's own address, 0..100; entries naming the same
	// revision add up.
	Percent int64
}

// RouteService is a Kubernetes Service the controller writes for a Route
// (labelled serving.sockscale.dev/route): the Route's own address, or a
// tag's.
type RouteService struct {
	// Key is the Service's namespace and name.
	Key target.Key
	// Route is the Route's name (label serving.sockscale.dev/route), in
	// the Service's namespace.
	Route string
	// Tag (label serving.sockscale.dev/tag) is set on a tag's Service.
	Tag string
	// ClusterIPs and Ports of the Service, as for a target.
	ClusterIPs []netip.Addr
	Ports      []uint16
	// Hosts: those of HTTPRoutes and Ingresses whose backend is the
	// Service.
	Hosts []string
}

// Validate says what is wrong with s.
func (s *RouteService) Validate() error {
	var errs []error
	if s.Key.Namespace == "" || s.Key.Name == "" {
		errs = append(errs, fmt.Errorf("key %q: namespace and name must both be set", s.Key))
	}
	if s.Route == "" {
		errs = append(errs, errors.New("route: must be set"))
	}
	for _, ip := range s.ClusterIPs {
		if !ip.IsValid() {
			errs = append(errs, errors.New("clusterIPs: holds an invalid address"))
			break
		}
	}
	if slices.Contains(s.Ports, 0) {
		errs = append(errs, errors.New("ports: port 0 is not a port"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("route Service %s: %w", s.Key, err)
	}
	return nil
}

func (s *RouteService) route() target.Key {
	return target.Key{Namespace: s.Key.Namespace, Name: s.Route}
}

// what names the Service in messages: "Route default/hello" or "tag
// latest of Route default/hello".
func (s *RouteService) what() string {
	if s.Tag != "" {
		return fmt.Sprintf("tag %q of Route %s", s.Tag, s.route())
	}
	return "Route " + s.route().String()
}

// checkPort refuses a port (0: none given) that is not the Service's.
func (s *RouteService) checkPort(host string, port uint16) error {
	if port == 0 || len(s.Ports) == 0 || slices.Contains(s.Ports, port) {
		return nil
	}
	return fmt.Errorf("%w: host %q names Service %s of %s, whose ports are %v, not %d", ErrNotFound, host, s.Key, s.what(), s.Ports, port)
}

// SetReadyPods tells the table how to learn a target's ready pods, as the
// throttle knows them (throttle.Throttler.ReadyPods): a target with none
// has its activator in the path, for ProxiedFirst. Without it only the
// ServerlessService's mode (target.Target.Proxy) counts. f must not call
// into the table.
func (tb *Table) SetReadyPods(f func(target.Key) int) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.readyPods = f
}

// UpsertRoute adds r or replaces the Route with its key.
func (tb *Table) UpsertRoute(r Route) {
	c := Route{Key: r.Key, Traffic: slices.Clone(r.Traffic)}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.routes[r.Key] = &c
}

// DeleteRoute removes the Route with key k, if any; its Services stay
// until deleted, and requests for them get ErrRouteNotReady.
func (tb *Table) DeleteRoute(k target.Key) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	delete(tb.routes, k)
}

// UpsertRouteService adds s or replaces the Service with its key (a
// target with the same key included: the watcher decides which a
// Service is). Delete removes it.
func (tb *Table) UpsertRouteService(s RouteService) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("upsert: %w", err)
	}
	c := s
	c.ClusterIPs = make([]netip.Addr, len(s.ClusterIPs))
	for i, ip := range s.ClusterIPs {
		c.ClusterIPs[i] = ip.Unmap()
	}
	c.Ports = slices.Clone(s.Ports)
	c.Hosts = nil
	for _, h := range s.Hosts {
		if h = normalizeHost(h); h != "" && !slices.Contains(c.Hosts, h) {
			c.Hosts = append(c.Hosts, h)
		}
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.forget(s.Key)
	tb.services[s.Key] = &c
	tb.index(c.Key, c.ClusterIPs, c.Hosts)
	return nil
}

// revisions lists the revisions s can lead to: the tag's, or those with
// percent > 0. tb.mu must be held.
func (tb *Table) revisions(s *RouteService) []string {
	r := tb.routes[s.route()]
	if r == nil {
		return nil
	}
	var out []string
	for _, t := range r.Traffic {
		if (s.Tag != "" && t.Tag == s.Tag) || (s.Tag == "" && t.Percent > 0) {
			out = append(out, t.Revision)
		}
	}
	return out
}

// pickRevision returns the target of the revision that a request for s
// goes to; what says how the request named s, for errors. tb.mu must be
// held (read).
func (tb *Table) pickRevision(s *RouteService, what string, pick Pick) (*target.Target, error) {
	rk := s.route()
	r := tb.routes[rk]
	if r == nil {
		return nil, fmt.Errorf("%w: %s names Service %s of Route %s, which this activator does not know (no such Route, or Routes cannot be watched: see the activator's log)",
			ErrRouteNotReady, what, s.Key, rk)
	}
	if len(r.Traffic) == 0 {
		return nil, fmt.Errorf("%w: %s names %s, whose status.traffic is empty: the controller has not resolved its revisions yet", ErrRouteNotReady, what, s.what())
	}
	var rev string
	if s.Tag != "" {
		// During a gradual rollout a tagged latest target is split into
		// pieces (oldest first), each keeping the tag: the tag's address
		// follows the same shares, and at 0 % goes to its newest piece
		// (the node agents' kernel split does the same).
		tagged := &Route{Key: r.Key}
		for _, t := range r.Traffic {
			if t.Tag == s.Tag {
				tagged.Traffic = append(tagged.Traffic, t)
			}
		}
		if len(tagged.Traffic) == 0 {
			return nil, fmt.Errorf("%w: %s names %s, which is not in the Route's status.traffic", ErrRouteNotReady, what, s.what())
		}
		var ok bool
		if rev, ok = tb.choose(tagged, pick); !ok {
			rev = tagged.Traffic[len(tagged.Traffic)-1].Revision
		}
		if rev == "" {
			return nil, fmt.Errorf("%w: %s names %s, whose status.traffic entry names no revision", ErrRouteNotReady, what, s.what())
		}
	} else {
		var ok bool
		if rev, ok = tb.choose(r, pick); !ok {
			return nil, fmt.Errorf("%w: %s names %s, whose status.traffic has no revision with percent > 0", ErrRouteNotReady, what, s.what())
		}
	}
	t := tb.targets[target.Key{Namespace: rk.Namespace, Name: rev}]
	if t == nil {
		return nil, fmt.Errorf("%w: %s names %s, whose revision %s is no target this activator knows (no PodAutoscaler names a public Service %s/%s); not sent elsewhere",
			ErrRevisionUnknown, what, s.what(), rev, rk.Namespace, rev)
	}
	return t, nil
}

// choose draws a revision of r for its own address, as pick says. tb.mu
// must be held (read).
func (tb *Table) choose(r *Route, pick Pick) (string, bool) {
	if pick == ProxiedFirst {
		proxied := func(t Traffic) bool { return tb.proxied(target.Key{Namespace: r.Key.Namespace, Name: t.Revision}) }
		if rev, ok := Choose(r.Traffic, proxied, tb.intN); ok {
			return rev, true
		}
	}
	return Choose(r.Traffic, nil, tb.intN)
}

// proxied says whether the activator is in the path of target k: its
// ServerlessService is in Proxy mode, or it has no ready pod as this
// activator knows. An unknown target is not. tb.mu must be held (read).
func (tb *Table) proxied(k target.Key) bool {
	t := tb.targets[k]
	if t == nil {
		return false
	}
	return t.Proxy || (tb.readyPods != nil && tb.readyPods(k) == 0)
}

// Choose draws one revision from the entries with percent > 0 that
// eligible accepts (nil: all), each with probability percent / (sum of
// their percents); entries naming one revision add up. intN(n) must
// return a uniform draw from [0, n). False when no entry qualifies.
func Choose(traffic []Traffic, eligible func(Traffic) bool, intN func(n int64) int64) (string, bool) {
	ok := func(t Traffic) bool { return t.Percent > 0 && t.Revision != "" && (eligible == nil || eligible(t)) }
	var total int64
	for _, t := range traffic {
		if ok(t) {
			total += t.Percent
		}
	}
	if total == 0 {
		return "", false
	}
	x := intN(total)
	for _, t := range traffic {
		if !ok(t) {
			continue
		}
		if x < t.Percent {
			return t.Revision, true
		}
		x -= t.Percent
	}
	return "", false // unreachable: x < total
}

// Picking returns the table as the resolver of one port: requests for a
// Route's own address choose as pick says.
func (tb *Table) Picking(pick Pick) *Picker { return &Picker{tb: tb, pick: pick} }

// Picker is a Table whose Route choice is fixed (Table.Picking).
type Picker struct {
	tb   *Table
	pick Pick
}

// Resolve is Table.Resolve with the Picker's choice for Routes.
func (p *Picker) Resolve(header, host string) (*target.Target, error) {
	return p.tb.resolve(header, host, p.pick)
}

// Reaches is Table.Reaches.
func (p *Picker) Reaches(host string, k target.Key) bool { return p.tb.Reaches(host, k) }
