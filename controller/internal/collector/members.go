package collector

import (
	"net/netip"

	"github.com/sockscale/sockscale/internal/stats"
)

// Members tells the collector every pod a target has now, ready or not,
// and its node: the endpoints of its private Service's EndpointSlices
// (which list not-ready and terminating pods too). The stats handler
// checks agents' records against them (PodNodes). Unwatched targets are
// ignored.
func (c *Collector) Members(key Key, pods map[netip.Addr]string) {
	t := c.target(key)
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.pods {
		p.member, p.memberNode = false, ""
	}
	for a, node := range pods {
		if ip, ok := addrKeyOf(a); ok {
			p := t.podAt(ip)
			p.member, p.memberNode = true, node
		}
	}
}

// PodNode is where a pod record's target has the pod.
type PodNode struct {
	// Watched: the record's target is autoscaled; records of others are
	// ignored anyway.
	Watched bool
	// Node is the node the target's endpoints place the pod's address
	// on; "" when the target has no such pod (or its endpoint names no
	// node).
	Node string
}

// PodNodes returns, for each record, where its target has the pod (one
// read lock of the targets map for the whole batch).
func (c *Collector) PodNodes(pods []stats.PodStat) []PodNode {
	out := make([]PodNode, len(pods))
	c.mu.RLock()
	defer c.mu.RUnlock()
	for i := range pods {
		p := &pods[i]
		t, ok := c.targets[Key{p.Namespace, p.Workload}]
		if !ok {
			continue
		}
		out[i].Watched = true
		if ip, ok := addrKeyOf(p.IP); ok {
			t.mu.Lock()
			if p := t.pods[ip]; p != nil && p.member {
				out[i].Node = p.memberNode
			}
			t.mu.Unlock()
		}
	}
	return out
}
