package watch

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sockscale/sockscale/activator/internal/target"
)

// conflicts keeps the route host claims that the conflict rule ignores
// (routes.go), per target, so that each is logged once while it lasts and
// the gauge says how many there are. No label per host or namespace: they
// are the tenants' to multiply; the log names them.
type conflicts struct {
	mu       sync.Mutex
	byTarget map[target.Key][]hostConflict
	gauge    prometheus.Gauge
}

func newConflicts(reg prometheus.Registerer) *conflicts {
	c := &conflicts{
		byTarget: make(map[target.Key][]hostConflict),
		gauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sockscale_activator_route_host_conflicts",
			Help: "Host names claimed by a route (an Ingress, or an HTTPRoute a Gateway accepted) for a target but owned by an older route of another namespace, so ignored: one per host and ignored route.",
		}),
	}
	if reg != nil {
		reg.MustRegister(c.gauge)
	}
	return c
}

// claims returns the watcher's conflicts, made on first use (Sync may be
// called without Run).
func (w *Watcher) claims() *conflicts {
	w.conflictsOnce.Do(func() { w.conflicts = newConflicts(w.Registerer) })
	return w.conflicts
}

// setConflicts records target k's ignored claims (nil: none, or k is
// gone) and logs each that no target had before.
func (w *Watcher) setConflicts(k target.Key, cs []hostConflict) {
	c := w.claims()
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := c.all()
	if len(cs) == 0 {
		delete(c.byTarget, k)
	} else {
		c.byTarget[k] = cs
	}
	for _, x := range cs {
		if _, ok := seen[x]; !ok {
			seen[x] = struct{}{}
			w.Log.Warn("a route's host name is ignored: an older route of another namespace claims it",
				"host", x.Host, "route", x.Route.String(), "ownedBy", x.Owner.String(), "target", k.String())
		}
	}
	// One per host and ignored route, however many targets it names.
	type claim struct {
		host  string
		route routeRef
	}
	n := map[claim]struct{}{}
	for x := range c.all() {
		n[claim{x.Host, x.Route}] = struct{}{}
	}
	c.gauge.Set(float64(len(n)))
}

// all is the set of every target's conflicts. c.mu must be held.
func (c *conflicts) all() map[hostConflict]struct{} {
	out := make(map[hostConflict]struct{})
	for _, cs := range c.byTarget {
		for _, x := range cs {
			out[x] = struct{}{}
		}
	}
	return out
}
