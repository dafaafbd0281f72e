package netpol

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Pod is what the evaluator reads of a pod.
type Pod struct {
	Namespace string
	Name      string
	Labels    map[string]string
	// Ports are the pod's container ports, against which a policy's named
	// ports are resolved (only a destination's are read).
	Ports []corev1.ContainerPort
}

// Client is where a request comes from: its address, and the pod that
// has it if it is a pod's (nil: a node, or outside the cluster, which only
// ipBlock peers match).
type Client struct {
	Addr netip.Addr
	Pod  *Pod
	// NamespaceLabels are the labels of Pod's namespace, for
	// namespaceSelectors.
	NamespaceLabels map[string]string
}

// Admits says whether the NetworkPolicies of dest's namespace (policies;
// those of other namespaces are ignored) admit c to dest on port and
// protocol, as networking.k8s.io/v1 defines ingress: a pod no policy
// isolates for ingress admits everyone; an isolated pod admits what at
// least one of the policies selecting it allows (their union).
func Admits(policies []networkingv1.NetworkPolicy, dest Pod, port int32, protocol corev1.Protocol, c Client) bool {
	isolated := false
	for i := range policies {
		p := &policies[i]
		if p.Namespace != dest.Namespace || !ingressPolicy(p) || !matches(&p.Spec.PodSelector, dest.Labels) {
			continue
		}
		isolated = true
		for j := range p.Spec.Ingress {
			r := &p.Spec.Ingress[j]
			if portsMatch(r.Ports, dest, port, protocol) && fromMatches(r.From, p.Namespace, c) {
				return true
			}
		}
	}
	return !isolated
}

// ingressPolicy says whether p isolates the pods it selects for ingress:
// policyTypes names Ingress, or is empty (the API server defaults it to
// Ingress, plus Egress when the policy has egress rules; a policy read
// before that default still means ingress).
func ingressPolicy(p *networkingv1.NetworkPolicy) bool {
	if len(p.Spec.PolicyTypes) == 0 {
		return true
	}
	for _, t := range p.Spec.PolicyTypes {
		if t == networkingv1.PolicyTypeIngress {
			return true
		}
	}
	return false
}

// matches says whether sel selects set: every matchLabels pair and every
// matchExpressions requirement holds; an empty selector selects
// everything. It is metav1.LabelSelectorAsSelector's meaning without
// building a selector, which cost most of a forward's check
// (BenchmarkAdmits, ten policies: 75 µs and 220 allocations with it, 8 µs
// and none without). A requirement the API server would refuse (an
// unknown operator, In or NotIn without values, Exists or DoesNotExist
// with some) selects nothing: the safe side.
func matches(sel *metav1.LabelSelector, set map[string]string) bool {
	for k, v := range sel.MatchLabels {
		if got, ok := set[k]; !ok || got != v {
			return false
		}
	}
	for _, r := range sel.MatchExpressions {
		v, has := set[r.Key]
		switch r.Operator {
		case metav1.LabelSelectorOpIn:
			if len(r.Values) == 0 || !has || !slices.Contains(r.Values, v) {
				return false
			}
		case metav1.LabelSelectorOpNotIn:
			if len(r.Values) == 0 || has && slices.Contains(r.Values, v) {
				return false
			}
		case metav1.LabelSelectorOpExists:
			if len(r.Values) > 0 || !has {
				return false
			}
		case metav1.LabelSelectorOpDoesNotExist:
			if len(r.Values) > 0 || has {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// fromMatches: an empty or absent from admits every source; else one of
// its peers must match c. ns is the policy's namespace.
func fromMatches(from []networkingv1.NetworkPolicyPeer, ns string, c Client) bool {
	if len(from) == 0 {
		return true
	}
	for i := range from {
		if peerMatches(&from[i], ns, c) {
			return true
		}
	}
	return false
}

// peerMatches: an ipBlock matches any address in its cidr but not in an
// except; selectors match pods only: a podSelector alone the pods of the
// policy's namespace, a namespaceSelector alone every pod of the
// namespaces it selects, both together the pods matching the one in the
// namespaces matching the other.
func peerMatches(peer *networkingv1.NetworkPolicyPeer, ns string, c Client) bool {
	if peer.IPBlock != nil {
		return inBlock(peer.IPBlock, c.Addr)
	}
	if c.Pod == nil {
		return false
	}
	switch {
	case peer.PodSelector != nil && peer.NamespaceSelector == nil:
		return c.Pod.Namespace == ns && matches(peer.PodSelector, c.Pod.Labels)
	case peer.NamespaceSelector != nil:
		if !matches(peer.NamespaceSelector, c.NamespaceLabels) {
			return false
		}
		return peer.PodSelector == nil || matches(peer.PodSelector, c.Pod.Labels)
	default:
		// A peer with nothing set is refused by the API server.
		return false
	}
}

// inBlock says whether a is in b's cidr and in none of its excepts. A
// cidr that does not parse matches nothing; an except that does not parse
// excludes everything (both refused by the API server: the safe side).
func inBlock(b *networkingv1.IPBlock, a netip.Addr) bool {
	a = a.Unmap()
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil || !cidr.Contains(a) {
		return false
	}
	for _, e := range b.Except {
		ex, err := netip.ParsePrefix(e)
		if err != nil || ex.Contains(a) {
			return false
		}
	}
	return true
}

// portsMatch: empty ports admit every port; else one must match port and
// protocol on dest.
func portsMatch(ports []networkingv1.NetworkPolicyPort, dest Pod, port int32, protocol corev1.Protocol) bool {
	if len(ports) == 0 {
		return true
	}
	for i := range ports {
		if portMatches(&ports[i], dest, port, protocol) {
			return true
		}
	}
	return false
}

// portMatches: the protocol (TCP when unset) must be protocol; no port
// means all of them; a number is that port, or the range up to endPort; a
// name is the dest container port of that name, if its number is port
// and its protocol (TCP when unset) the same.
func portMatches(p *networkingv1.NetworkPolicyPort, dest Pod, port int32, protocol corev1.Protocol) bool {
	proto := corev1.ProtocolTCP
	if p.Protocol != nil {
		proto = *p.Protocol
	}
	if proto != protocol {
		return false
	}
	if p.Port == nil {
		return true
	}
	if p.Port.Type == intstr.Int {
		if p.EndPort != nil {
			return p.Port.IntVal <= port && port <= *p.EndPort
		}
		return p.Port.IntVal == port
	}
	for _, cp := range dest.Ports {
		cproto := cp.Protocol
		if cproto == "" {
			cproto = corev1.ProtocolTCP
		}
		if cp.Name != "" && cp.Name == p.Port.StrVal && cp.ContainerPort == port && cproto == protocol {
			return true
		}
	}
	return false
}
