package redirect

import (
	"cmp"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	bpfredirect "github.com/sockscale/sockscale/bpf/redirect"
	"github.com/sockscale/sockscale/internal/svcaddr"
)

// routeTarget is the Target of a Service with the route label: the
// Route's own address, or a tag's when it has the tag label too.
func routeTarget(svc *corev1.Service) Target {
	t := Target{Kind: KindRoute, NamespacedName: types.NamespacedName{Namespace: svc.Namespace, Name: svc.Labels[servingv1alpha1.RouteLabelKey]}}
	if tag, ok := svc.Labels[servingv1alpha1.TagLabelKey]; ok {
		t.Kind, t.Tag = KindTag, tag
	}
	return t
}

// computeRoutes adds the entries of the Routes' addresses to d, from the
// split in effect, status.traffic (during a gradual rollout, its current
// step):
//
//   - each TCP port of the Route's own Service -> the public Services of
//     the revisions with percent > 0, weight = percent, summed per
//     revision. Example: traffic [hello-00001 30, hello-00002 70,
//     hello-00002 0 tag canary], Service hello 10.96.0.50:80 "http",
//     revision Services 10.96.0.11 and 10.96.0.12 port 80 "http" =>
//     10.96.0.50:80 -> [10.96.0.11:80 w30, 10.96.0.12:80 w70].
//   - each TCP port of a tag's Service -> its target's revision's public
//     Service, weight 1 whatever the percent: canary-hello's address ->
//     [10.96.0.12:80 w1].
//
// A revision's address is its public Service's first cluster IP of the
// family of the Route Service's address (a connect keeps its family: a
// dual-stack Route's IPv6 address splits over the revisions' IPv6
// addresses) at the port named as the Route Service's port, else at its
// first TCP port. A
// revision in Proxy mode keeps its own entry, so the kernel's second hop
// takes the connect on to an activator; the split never changes when a
// revision scales to or from zero.
func (d *Desired) computeRoutes(in Inputs) {
	routes := make(map[types.NamespacedName]*servingv1alpha1.Route, len(in.Routes))
	for i := range in.Routes {
		rt := &in.Routes[i]
		routes[types.NamespacedName{Namespace: rt.Namespace, Name: rt.Name}] = rt
	}
	// Sorted by Route, its own address before its tags', so a duplicate
	// address is skipped in the same one every time.
	svcs := slices.Clone(in.RouteServices)
	slices.SortFunc(svcs, func(a, b *corev1.Service) int {
		ta, tb := routeTarget(a), routeTarget(b)
		return cmp.Or(cmp.Compare(ta.Namespace, tb.Namespace), cmp.Compare(ta.Name, tb.Name),
			cmp.Compare(ta.Kind, tb.Kind), cmp.Compare(ta.Tag, tb.Tag), cmp.Compare(a.Name, b.Name)) // "route" < "tag"
	})
	for _, svc := range svcs {
		t := routeTarget(svc)
		addrs, reason := svcaddr.Redirected(svc, 0)
		for _, a := range addrs {
			if _, taken := d.Targets[a]; !taken {
				d.Targets[a] = t
			}
		}
		if reason == "" && in.RoutesUnavailable {
			reason = SkipRoutesUnavailable
		}
		if reason != "" {
			d.Skipped[t] = reason
			continue
		}
		rt := routes[t.NamespacedName]
		if rt == nil {
			d.Skipped[t] = SkipRouteNotFound
			continue
		}
		for _, a := range addrs {
			if d.Targets[a] != t {
				d.Skipped[t] = SkipDuplicate
				continue
			}
			backends, reason := routeBackends(rt, t, a.Addr().Is4(), portName(svc, a.Port()), in.Services)
			if reason != "" {
				d.Skipped[t] = reason
				continue
			}
			d.Entries[a] = Entry{Target: t, Backends: backends}
		}
	}
}

// routeBackends are the backends of t's address (IPv4 if v4, else IPv6) at
// the Route Service's port named port, sorted by address, or why it has
// none.
func routeBackends(rt *servingv1alpha1.Route, t Target, v4 bool, port string, svcs map[types.NamespacedName]*corev1.Service) ([]bpfredirect.Backend, string) {
	// Weights per revision, in the order of status.traffic.
	var revisions []string
	weights := make(map[string]int64)
	tagged := "" // the newest revision of the tag (entries are oldest first)
	for _, tt := range rt.Status.Traffic {
		if t.Kind == KindTag {
			if tt.Tag != t.Tag {
				continue
			}
			// During a gradual rollout a tagged latest target is split
			// into pieces, each keeping the tag: the tag's address follows
			// the same shares, and at 0 % goes to its newest piece (the
			// activators choose the same way).
			tagged = tt.RevisionName
		}
		if tt.Percent != nil && *tt.Percent > 0 {
			if _, seen := weights[tt.RevisionName]; !seen {
				revisions = append(revisions, tt.RevisionName)
			}
			weights[tt.RevisionName] += *tt.Percent
		}
	}
	if t.Kind == KindTag && len(revisions) == 0 && tagged != "" {
		revisions, weights = []string{tagged}, map[string]int64{tagged: 1}
	}
	switch {
	case len(revisions) == 0 && t.Kind == KindTag:
		return nil, SkipTagNotInTraffic
	case len(revisions) == 0:
		return nil, SkipNoTraffic
	case len(revisions) > bpfredirect.MaxBackends:
		return nil, SkipTooManyRevisions
	}
	out := make([]bpfredirect.Backend, 0, len(revisions))
	for _, rev := range revisions {
		var svc *corev1.Service
		if rev != "" {
			svc = svcs[types.NamespacedName{Namespace: rt.Namespace, Name: rev}]
		}
		addr, reason := revisionAddr(svc, v4, port)
		if reason != "" {
			return nil, reason
		}
		out = append(out, bpfredirect.Backend{Addr: addr, Weight: uint32(min(weights[rev], bpfredirect.MaxWeight))})
	}
	slices.SortFunc(out, func(a, b bpfredirect.Backend) int { return a.Addr.Compare(b.Addr) })
	return out, ""
}

// revisionAddr is a revision's public Service address for a Route port
// named port: its first cluster IP of the family (IPv4 if v4, else IPv6)
// at the TCP port of that name, else at its first TCP port.
func revisionAddr(svc *corev1.Service, v4 bool, port string) (netip.AddrPort, string) {
	addrs, reason := svcaddr.Redirected(svc, 0)
	switch {
	case reason == svcaddr.NoService:
		return netip.AddrPort{}, SkipRevisionNoService
	case reason != "":
		return netip.AddrPort{}, SkipRevisionNoAddress
	}
	i := slices.IndexFunc(addrs, func(a netip.AddrPort) bool { return a.Addr().Is4() == v4 })
	if i < 0 {
		return netip.AddrPort{}, SkipRevisionNoAddress
	}
	ip := addrs[i].Addr()
	first := int32(-1)
	for _, p := range svc.Spec.Ports {
		if p.Protocol != corev1.ProtocolTCP && p.Protocol != "" {
			continue
		}
		if p.Name == port {
			return netip.AddrPortFrom(ip, uint16(p.Port)), ""
		}
		if first < 0 {
			first = p.Port
		}
	}
	return netip.AddrPortFrom(ip, uint16(first)), "" // svcaddr found a TCP port
}

// portName is the name of svc's TCP port numbered port.
func portName(svc *corev1.Service, port uint16) string {
	for _, p := range svc.Spec.Ports {
		if uint16(p.Port) == port && (p.Protocol == corev1.ProtocolTCP || p.Protocol == "") {
			return p.Name
		}
	}
	return ""
}
