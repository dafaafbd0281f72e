package watch

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/activator/internal/readiness"
)

// fuzzBytes hands out the fuzz input a byte at a time (0 when used up).
type fuzzBytes []byte

func (b *fuzzBytes) next() byte {
	if len(*b) == 0 {
		return 0
	}
	c := (*b)[0]
	*b = (*b)[1:]
	return c
}

// pick returns one of xs, chosen by the next byte.
func pick[T any](b *fuzzBytes, xs ...T) T { return xs[int(b.next())%len(xs)] }

// FuzzSlicePods: EndpointSlices are the API server's, but what they hold
// (addresses, ports, conditions) comes from pods a tenant runs.
//
//	| output               | invariant                                                  |
//	|----------------------|------------------------------------------------------------|
//	| every pod            | an IPv4 or IPv6 address (no IPv4-mapped IPv6, no zone, no  |
//	|                      | FQDN), of the family of a slice listing it                 |
//	| every pod            | port 1..65535, the TCP port named portName of a slice      |
//	|                      | listing the address                                        |
//	| every pod            | at an IPv6 address only if no IPv4 endpoint names its pod  |
//	|                      | (a dual-stack pod is one destination)                      |
//	| every pod            | listed by an endpoint that is not terminating; ready if    |
//	|                      | any such endpoint says ready (or says nothing)             |
//	| the list             | sorted, each address and port once                         |
//	| the list             | equal to a simple model built from the slices              |
func FuzzSlicePods(f *testing.F) {
	f.Add("http", "10.244.1.7", []byte{2, 0, 2, 0, 1, 1, 1, 3, 1, 0, 1, 1, 1, 2, 1, 5, 2, 2})
	f.Add("", "10.0.0.9", []byte{1, 0, 1, 1, 2, 1, 1, 2, 2, 0, 0, 0, 1, 8, 1, 1, 2})
	f.Add("http", "::ffff:10.0.0.3", []byte{3, 0, 3, 0, 4, 1, 0, 3, 5, 2, 1, 4, 3, 2, 8, 8, 2, 1})
	f.Add("http", "fd00::2", []byte{2, 0, 1, 0, 0, 1, 1, 1, 1, 1, 0, 2, 1, 1, 1, 1, 0, 0, 1, 2, 1, 1, 1, 3, 1})
	f.Fuzz(func(t *testing.T, portName, extra string, data []byte) {
		b := fuzzBytes(data)
		items := make([]discoveryv1.EndpointSlice, b.next()%4)
		for i := range items {
			s := &items[i]
			s.AddressType = pick(&b, discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN)
			for range b.next() % 4 {
				p := discoveryv1.EndpointPort{
					Name:     pick(&b, ptr.To(portName), nil, ptr.To(""), ptr.To("metrics"), ptr.To(strings.ToUpper(portName))),
					Port:     pick(&b, ptr.To(int32(8080)), nil, ptr.To(int32(0)), ptr.To(int32(-1)), ptr.To(int32(65535)), ptr.To(int32(65536)), ptr.To(int32(1)), ptr.To(int32(1<<20)), ptr.To(int32(b.next())<<8|int32(b.next()))),
					Protocol: pick(&b, ptr.To(corev1.ProtocolTCP), nil, ptr.To(corev1.ProtocolUDP), ptr.To(corev1.ProtocolSCTP)),
				}
				s.Ports = append(s.Ports, p)
			}
			for range b.next() % 5 {
				ep := discoveryv1.Endpoint{Conditions: discoveryv1.EndpointConditions{
					Ready:       pick(&b, nil, ptr.To(true), ptr.To(false)),
					Terminating: pick(&b, nil, ptr.To(false), ptr.To(true)),
				}, TargetRef: pick(&b, nil, &corev1.ObjectReference{Kind: "Pod", Name: "a"}, &corev1.ObjectReference{Kind: "Pod", Name: "b"},
					&corev1.ObjectReference{Name: "a"}, &corev1.ObjectReference{Kind: "Node", Name: "b"})}
				for range b.next() % 3 {
					ep.Addresses = append(ep.Addresses, pick(&b, "10.0.0.1", "10.0.0.2", "10.0.0.10", "fd00::1", "::ffff:10.0.0.1", "010.0.0.1", "10.0.0.256", "", extra,
						"fd00::2", "fe80::1%eth0", "FD00::1"))
				}
				s.Endpoints = append(s.Endpoints, ep)
			}
		}

		got := slicePods(items, portName, nil)

		for i, p := range got {
			a := p.Addr.Addr()
			if valid := a.Is4() || (a.Is6() && !a.Is4In6() && a.Zone() == ""); !valid || p.Addr.Port() == 0 {
				t.Errorf("pod %v: not an IPv4 or IPv6 address with a port", p.Addr)
			}
			if i > 0 && got[i-1].Addr.Compare(p.Addr) >= 0 {
				t.Errorf("pods not sorted or repeated: %v then %v", got[i-1].Addr, p.Addr)
			}
		}
		if diff := cmp.Diff(slicePodsModel(items, portName), got, cmpopts.EquateEmpty(), cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
			t.Errorf("slicePods(portName %q) differs from the model (-model +got):\n%s\nslices: %+v", portName, diff, items)
		}
	})
}

// slicePodsModel is slicePods written plainly: for every IPv4 slice,
// then every IPv6 one, with a TCP (or unspecified protocol) port named
// portName in 1..65535 (the first such), every address of the slice's
// family of every endpoint that is not terminating, but IPv6 endpoints
// of a pod (targetRef of kind Pod or none) that some such IPv4 slice
// names.
func slicePodsModel(items []discoveryv1.EndpointSlice, portName string) []readiness.Pod {
	ready := map[netip.AddrPort]bool{}
	portOf := func(s discoveryv1.EndpointSlice) int {
		for _, p := range s.Ports {
			if p.Port != nil && ptr.Deref(p.Name, "") == portName && ptr.Deref(p.Protocol, corev1.ProtocolTCP) == corev1.ProtocolTCP &&
				*p.Port >= 1 && *p.Port <= 65535 {
				return int(*p.Port)
			}
		}
		return -1
	}
	podOf := func(ep discoveryv1.Endpoint) string {
		if ep.TargetRef != nil && (ep.TargetRef.Kind == "Pod" || ep.TargetRef.Kind == "") {
			return ep.TargetRef.Name
		}
		return ""
	}
	dualStack := map[string]bool{}
	for _, s := range items {
		if s.AddressType == discoveryv1.AddressTypeIPv4 && portOf(s) > 0 {
			for _, ep := range s.Endpoints {
				if p := podOf(ep); p != "" {
					dualStack[p] = true
				}
			}
		}
	}
	for _, s := range items {
		port := portOf(s)
		if port < 0 || (s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6) {
			continue
		}
		for _, ep := range s.Endpoints {
			if ptr.Deref(ep.Conditions.Terminating, false) {
				continue
			}
			if s.AddressType == discoveryv1.AddressTypeIPv6 && podOf(ep) != "" && dualStack[podOf(ep)] {
				continue
			}
			for _, a := range ep.Addresses {
				ip, err := netip.ParseAddr(a)
				if err != nil {
					continue
				}
				if s.AddressType == discoveryv1.AddressTypeIPv4 && !ip.Is4() {
					continue
				}
				if s.AddressType == discoveryv1.AddressTypeIPv6 && (!ip.Is6() || ip.Is4In6() || ip.Zone() != "") {
					continue
				}
				ap := netip.AddrPortFrom(ip, uint16(port))
				ready[ap] = ready[ap] || ptr.Deref(ep.Conditions.Ready, true)
			}
		}
	}
	var out []readiness.Pod
	for ap, r := range ready {
		out = append(out, readiness.Pod{Addr: ap, Ready: r})
	}
	slices.SortFunc(out, func(a, b readiness.Pod) int { return a.Addr.Compare(b.Addr) })
	return out
}

// routesReader serves Ingresses and HTTPRoutes from memory, honouring the
// namespace of a List but not the field selector: every route of the
// namespace is offered, a superset of what the index would select.
type routesReader struct {
	ings   []networkingv1.Ingress
	routes []unstructured.Unstructured
}

func (r routesReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return errors.New("routesReader: Get is not served")
}

func (r routesReader) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	o := (&client.ListOptions{}).ApplyOptions(opts)
	switch l := list.(type) {
	case *networkingv1.IngressList:
		for _, i := range r.ings {
			if o.Namespace == "" || i.Namespace == o.Namespace {
				l.Items = append(l.Items, *i.DeepCopy())
			}
		}
	case *unstructured.UnstructuredList:
		for _, u := range r.routes {
			if o.Namespace == "" || u.GetNamespace() == o.Namespace {
				l.Items = append(l.Items, *u.DeepCopy())
			}
		}
	default:
		return errors.New("routesReader: cannot list that")
	}
	return nil
}

// FuzzRouteHosts: Ingresses and HTTPRoutes are any tenant's objects; the
// hosts they give a target must be that target's own.
//
//	| output               | invariant                                                  |
//	|----------------------|------------------------------------------------------------|
//	| every host           | lower case, no trailing dot, no wildcard, not empty        |
//	| every host           | a valid DNS-1123 subdomain whenever the routes' host names |
//	|                      | are (the API server and the Gateway API schema see to it)  |
//	| every host           | from a route in the target's namespace: an Ingress rule    |
//	|                      | with a path to the target's Service, any rule of an        |
//	|                      | Ingress whose default backend it is, or an attached        |
//	|                      | HTTPRoute (Accepted True, of its generation) with a        |
//	|                      | backendRef to it (core Service, own namespace); never a    |
//	|                      | host only a rule to another Service has                    |
//	| every host           | owned by the target's namespace: the oldest route of any   |
//	|                      | namespace claiming it (then namespace/name) is there       |
//	| every conflict       | a host of the target's routes left out, whose owner is an  |
//	|                      | older route of another namespace                           |
//	| the list             | sorted, each host once, equal to a simple model            |
func FuzzRouteHosts(f *testing.F) {
	f.Add("Shop.Example.com.", "cart.example.com", "www.example.com", []byte{3, 0, 3, 0, 1, 2, 0, 1, 1, 0, 2, 2, 1, 0, 1, 1, 2, 1, 1})
	f.Add("shop.example.com", "*.shop.example.com", "a", []byte{0, 2, 0, 2, 0, 1, 2, 1, 0, 0, 0, 0, 2, 1, 0, 1, 0, 2})
	f.Add("hello.team", "x y", "", []byte{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1})
	const ns, name = "team", "hello"
	f.Fuzz(func(t *testing.T, h1, h2, h3 string, data []byte) {
		b := fuzzBytes(data)
		host := func() string {
			return pick(&b, h1, h2, h3, "", strings.ToUpper(h1)+".", "*."+h2, h3+".")
		}
		var r routesReader
		for i := range b.next() % 4 {
			ing := networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: pick(&b, ns, ns, "other"), Name: "ing" + string(rune('a'+i)),
				CreationTimestamp: metav1.Unix(int64(b.next()%3), 0)}}
			for range b.next() % 4 {
				rule := networkingv1.IngressRule{Host: host()}
				if b.next()%5 != 0 {
					rule.HTTP = &networkingv1.HTTPIngressRuleValue{}
					for range b.next() % 3 {
						var be networkingv1.IngressBackend
						if svc := pick(&b, name, "other", "", "-"); svc != "-" {
							be.Service = &networkingv1.IngressServiceBackend{Name: svc}
						}
						rule.HTTP.Paths = append(rule.HTTP.Paths, networkingv1.HTTPIngressPath{Backend: be})
					}
				}
				ing.Spec.Rules = append(ing.Spec.Rules, rule)
			}
			if svc := pick(&b, "-", name, "other", "-"); svc != "-" {
				ing.Spec.DefaultBackend = &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: svc}}
			}
			r.ings = append(r.ings, ing)
		}
		for i := range b.next() % 4 {
			u := newHTTPRoute()
			u.SetNamespace(pick(&b, ns, ns, "other"))
			u.SetName("route" + string(rune('a'+i)))
			u.SetCreationTimestamp(metav1.Unix(int64(b.next()%3), 0))
			u.SetGeneration(2)
			accepted := func(status string, gen int64) map[string]any {
				c := map[string]any{"type": "Accepted", "status": status}
				if gen != 0 {
					c["observedGeneration"] = gen
				}
				return map[string]any{"parentRef": map[string]any{"name": "gw"}, "conditions": []any{c}}
			}
			switch b.next() % 6 {
			case 1:
				u.Object["status"] = map[string]any{"parents": []any{accepted("True", 0)}}
			case 2:
				u.Object["status"] = map[string]any{"parents": []any{accepted("False", 2)}}
			case 3: // accepted before the last edit
				u.Object["status"] = map[string]any{"parents": []any{accepted("True", 1)}}
			case 4: // one Gateway refuses, another accepts
				u.Object["status"] = map[string]any{"parents": []any{accepted("False", 2), accepted("True", 2)}}
			case 5:
				u.Object["status"] = map[string]any{"parents": []any{"not a parent", map[string]any{"conditions": "not a list"}}}
			}
			var hostnames []any
			for range b.next() % 4 {
				hostnames = append(hostnames, host())
			}
			if b.next()%8 == 0 {
				hostnames = append(hostnames, int64(80)) // not a string: the hostnames are unreadable
			}
			var rules []any
			for range b.next() % 3 {
				var refs []any
				for range b.next() % 3 {
					ref := map[string]any{}
					for k, v := range map[string]string{
						"name":      pick(&b, name, "other", "", "-"),
						"group":     pick(&b, "-", "", "gateway.networking.k8s.io"),
						"kind":      pick(&b, "-", "Service", "Bucket"),
						"namespace": pick(&b, "-", ns, "other"),
					} {
						if v != "-" {
							ref[k] = v
						}
					}
					refs = append(refs, ref)
				}
				rules = append(rules, map[string]any{"backendRefs": refs})
			}
			u.Object["spec"] = map[string]any{"hostnames": hostnames, "rules": rules}
			r.routes = append(r.routes, *u)
		}

		w := &Watcher{httpRoutes: true}
		got, conflicts, err := w.routeHosts(context.Background(), r, hello)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range conflicts {
			if slices.Contains(got, c.Host) || c.Route.Namespace != ns || c.Owner.Namespace == ns || c.Owner.compare(c.Route) >= 0 {
				t.Errorf("conflict %+v: its host is kept, or its route is not the target's namespace's, or its owner is not an older route of another namespace", c)
			}
		}
		for i, h := range got {
			if h == "" || h != strings.ToLower(h) || strings.HasSuffix(h, ".") || strings.Contains(h, "*") {
				t.Errorf("host %q: empty, not lower case, with a trailing dot or a wildcard", h)
			}
			if i > 0 && got[i-1] >= h {
				t.Errorf("hosts not sorted or repeated: %q", got)
			}
		}
		validInput := true
		for _, h := range []string{h1, h2, h3} {
			h = strings.ToLower(strings.TrimSuffix(h, "."))
			validInput = validInput && (h == "" || len(validation.IsDNS1123Subdomain(h)) == 0)
		}
		for _, h := range got {
			if validInput && len(validation.IsDNS1123Subdomain(h)) > 0 {
				t.Errorf("host %q is not a DNS-1123 subdomain, though the routes' host names were", h)
			}
		}
		if diff := cmp.Diff(routeHostsModel(r, ns, name), got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("routeHosts differs from the model (-model +got):\n%s\ningresses: %+v\nroutes: %+v", diff, r.ings, r.routes)
		}
	})
}

// routeHostsModel is what routeHosts documents, written plainly.
func routeHostsModel(r routesReader, ns, name string) []string {
	norm := func(h string) string {
		// Wildcards and what is no host name at all name no one host.
		if h = strings.ToLower(strings.TrimSuffix(h, ".")); strings.Contains(h, "*") || len(validation.IsDNS1123Subdomain(h)) > 0 {
			return ""
		}
		return h
	}
	type claimant struct {
		created      int64
		nsName, kind string
	}
	claimants := map[string][]claimant{} // host -> every route claiming it
	set := map[string]bool{}             // hosts the target's routes give it
	for _, ing := range r.ings {
		for _, rule := range ing.Spec.Rules {
			if h := norm(rule.Host); h != "" {
				claimants[h] = append(claimants[h], claimant{ing.CreationTimestamp.Unix(), ing.Namespace + "/" + ing.Name, "Ingress"})
			}
		}
		if ing.Namespace != ns {
			continue
		}
		isDefault := ing.Spec.DefaultBackend != nil && ing.Spec.DefaultBackend.Service != nil && ing.Spec.DefaultBackend.Service.Name == name
		for _, rule := range ing.Spec.Rules {
			h := norm(rule.Host)
			if h == "" {
				continue
			}
			if isDefault {
				set[h] = true
			}
			if rule.HTTP == nil {
				continue
			}
			for _, p := range rule.HTTP.Paths {
				if p.Backend.Service != nil && p.Backend.Service.Name == name {
					set[h] = true
				}
			}
		}
	}
	for _, u := range r.routes {
		accepted := false
		status, _ := u.Object["status"].(map[string]any)
		parents, _ := status["parents"].([]any)
		for _, p := range parents {
			pm, _ := p.(map[string]any)
			conds, _ := pm["conditions"].([]any)
			for _, c := range conds {
				cm := c.(map[string]any)
				gen, _ := cm["observedGeneration"].(int64)
				accepted = accepted || (cm["type"] == "Accepted" && cm["status"] == "True" && (gen == 0 || gen == u.GetGeneration()))
			}
		}
		if !accepted {
			continue
		}
		spec := u.Object["spec"].(map[string]any)
		var hosts []string
		for _, h := range spec["hostnames"].([]any) {
			s, ok := h.(string)
			if !ok {
				hosts = nil
				break
			}
			if s = norm(s); s != "" {
				hosts = append(hosts, s)
			}
		}
		for _, h := range hosts {
			claimants[h] = append(claimants[h], claimant{u.GetCreationTimestamp().Unix(), u.GetNamespace() + "/" + u.GetName(), "HTTPRoute"})
		}
		if u.GetNamespace() != ns {
			continue
		}
		for _, rule := range spec["rules"].([]any) {
			for _, ref := range rule.(map[string]any)["backendRefs"].([]any) {
				m := ref.(map[string]any)
				str := func(k string) string { s, _ := m[k].(string); return s }
				if str("name") == name && str("group") == "" && (str("kind") == "" || str("kind") == "Service") && (str("namespace") == "" || str("namespace") == ns) {
					for _, h := range hosts {
						set[h] = true
					}
				}
			}
		}
	}
	out := make([]string, 0, len(set))
	for h := range set {
		oldest := slices.MinFunc(claimants[h], func(a, b claimant) int {
			if a.created != b.created {
				return int(a.created - b.created)
			}
			if a.nsName != b.nsName {
				return strings.Compare(a.nsName, b.nsName)
			}
			return strings.Compare(a.kind, b.kind)
		})
		if strings.HasPrefix(oldest.nsName, ns+"/") {
			out = append(out, h)
		}
	}
	slices.Sort(out)
	return out
}
