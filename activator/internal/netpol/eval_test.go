package netpol

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// pol builds a NetworkPolicy of namespace team.
type pol struct{ networkingv1.NetworkPolicy }

func policy(name string) *pol {
	return &pol{networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name}}}
}

func (p *pol) In(ns string) *pol { p.Namespace = ns; return p }

// Selecting sets the policy's podSelector (no labels: every pod).
func (p *pol) Selecting(kv ...string) *pol {
	p.Spec.PodSelector = *sel(kv...)
	return p
}

func (p *pol) Types(ts ...networkingv1.PolicyType) *pol { p.Spec.PolicyTypes = ts; return p }

func (p *pol) Ingress(rs ...networkingv1.NetworkPolicyIngressRule) *pol {
	p.Spec.Ingress = append(p.Spec.Ingress, rs...)
	return p
}

func (p *pol) Egress() *pol {
	p.Spec.Egress = append(p.Spec.Egress, networkingv1.NetworkPolicyEgressRule{})
	return p
}

func (p *pol) Obj() networkingv1.NetworkPolicy { return p.NetworkPolicy }

// sel is a label selector of key, value pairs.
func sel(kv ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{}
	for i := 0; i+1 < len(kv); i += 2 {
		if s.MatchLabels == nil {
			s.MatchLabels = map[string]string{}
		}
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func rule(from []networkingv1.NetworkPolicyPeer, ports ...networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyIngressRule {
	return networkingv1.NetworkPolicyIngressRule{From: from, Ports: ports}
}

func peers(ps ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyPeer { return ps }

func pods(kv ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: sel(kv...)}
}

func namespaces(kv ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: sel(kv...)}
}

func both(ns, pod *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: ns, PodSelector: pod}
}

func block(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

func port(n int32) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Port: ptr.To(intstr.FromInt32(n))}
}

func portRange(from, to int32) networkingv1.NetworkPolicyPort {
	p := port(from)
	p.EndPort = ptr.To(to)
	return p
}

func namedPort(name string) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Port: ptr.To(intstr.FromString(name))}
}

func udp(p networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyPort {
	p.Protocol = ptr.To(corev1.ProtocolUDP)
	return p
}

func tcp(p networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyPort {
	p.Protocol = ptr.To(corev1.ProtocolTCP)
	return p
}

// dest is pod hello-1 of team (app=hello), serving port 8080 named http.
var dest = Pod{Namespace: "team", Name: "hello-1", Labels: map[string]string{"app": "hello"},
	Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP}}}

// Clients: a frontend pod of team, a pod of shop (labelled tier=web), a
// pod of shop without that label, and an address that is no pod.
var (
	frontend = Client{Addr: netip.MustParseAddr("10.244.1.5"), Pod: &Pod{Namespace: "team", Name: "frontend", Labels: map[string]string{"role": "frontend"}},
		NamespaceLabels: map[string]string{"kubernetes.io/metadata.name": "team"}}
	shopWeb = Client{Addr: netip.MustParseAddr("10.244.2.9"), Pod: &Pod{Namespace: "shop", Name: "web", Labels: map[string]string{"role": "frontend"}},
		NamespaceLabels: map[string]string{"kubernetes.io/metadata.name": "shop", "tier": "web"}}
	shopBatch = Client{Addr: netip.MustParseAddr("10.244.2.10"), Pod: &Pod{Namespace: "shop", Name: "batch", Labels: map[string]string{"role": "batch"}},
		NamespaceLabels: map[string]string{"kubernetes.io/metadata.name": "shop", "tier": "web"}}
	outsider = Client{Addr: netip.MustParseAddr("192.168.7.1")}
)

func TestAdmits(t *testing.T) {
	type check struct {
		client Client
		port   int32
		proto  corev1.Protocol // "": TCP
	}
	tests := []struct {
		name     string
		policies []networkingv1.NetworkPolicy
		checks   map[string]check
		want     map[string]bool
	}{
		{
			name:     "no policy: not isolated, everyone",
			policies: nil,
			want:     map[string]bool{"frontend": true, "shopWeb": true, "outsider": true},
		},
		{
			name:     "a policy of another namespace does not isolate",
			policies: []networkingv1.NetworkPolicy{policy("deny").In("shop").Selecting().Obj()},
			want:     map[string]bool{"frontend": true, "shopWeb": true},
		},
		{
			name:     "a policy selecting other pods does not isolate",
			policies: []networkingv1.NetworkPolicy{policy("deny").Selecting("app", "other").Obj()},
			want:     map[string]bool{"frontend": true, "outsider": true},
		},
		{
			name:     "deny all: selected, no rules",
			policies: []networkingv1.NetworkPolicy{policy("deny").Selecting().Obj()},
			want:     map[string]bool{"frontend": false, "shopWeb": false, "outsider": false},
		},
		{
			name:     "policyTypes Egress only does not isolate for ingress",
			policies: []networkingv1.NetworkPolicy{policy("egress").Selecting().Types(networkingv1.PolicyTypeEgress).Obj()},
			want:     map[string]bool{"frontend": true, "outsider": true},
		},
		{
			name:     "policyTypes empty with egress rules still isolates for ingress",
			policies: []networkingv1.NetworkPolicy{policy("egress").Selecting().Egress().Obj()},
			want:     map[string]bool{"frontend": false, "outsider": false},
		},
		{
			name:     "policyTypes Ingress and Egress isolates",
			policies: []networkingv1.NetworkPolicy{policy("both").Selecting("app", "hello").Types(networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress).Obj()},
			want:     map[string]bool{"frontend": false},
		},
		{
			name:     "an empty from admits everyone, pods or not",
			policies: []networkingv1.NetworkPolicy{policy("all").Selecting().Ingress(rule(nil)).Obj()},
			want:     map[string]bool{"frontend": true, "shopWeb": true, "outsider": true},
		},
		{
			name:     "podSelector alone: pods of the policy's namespace only",
			policies: []networkingv1.NetworkPolicy{policy("fe").Selecting("app", "hello").Ingress(rule(peers(pods("role", "frontend")))).Obj()},
			// shopWeb has role=frontend too, but in another namespace.
			want: map[string]bool{"frontend": true, "shopWeb": false, "outsider": false},
		},
		{
			name:     "an empty podSelector: every pod of the namespace",
			policies: []networkingv1.NetworkPolicy{policy("ns").Selecting().Ingress(rule(peers(pods()))).Obj()},
			want:     map[string]bool{"frontend": true, "shopWeb": false, "outsider": false},
		},
		{
			name:     "namespaceSelector alone: every pod of the namespaces",
			policies: []networkingv1.NetworkPolicy{policy("web").Selecting().Ingress(rule(peers(namespaces("tier", "web")))).Obj()},
			want:     map[string]bool{"frontend": false, "shopWeb": true, "shopBatch": true, "outsider": false},
		},
		{
			name:     "namespaceSelector by kubernetes.io/metadata.name",
			policies: []networkingv1.NetworkPolicy{policy("shop").Selecting().Ingress(rule(peers(namespaces("kubernetes.io/metadata.name", "shop")))).Obj()},
			want:     map[string]bool{"frontend": false, "shopWeb": true},
		},
		{
			name:     "an empty namespaceSelector: every pod of every namespace, no outsider",
			policies: []networkingv1.NetworkPolicy{policy("pods").Selecting().Ingress(rule(peers(namespaces()))).Obj()},
			want:     map[string]bool{"frontend": true, "shopWeb": true, "outsider": false},
		},
		{
			name: "both selectors in one peer: the pods matching in the namespaces matching",
			policies: []networkingv1.NetworkPolicy{policy("and").Selecting().
				Ingress(rule(peers(both(sel("tier", "web"), sel("role", "frontend"))))).Obj()},
			want: map[string]bool{"frontend": false, "shopWeb": true, "shopBatch": false},
		},
		{
			name: "two peers are an or",
			policies: []networkingv1.NetworkPolicy{policy("or").Selecting().
				Ingress(rule(peers(namespaces("tier", "web"), pods("role", "frontend")))).Obj()},
			want: map[string]bool{"frontend": true, "shopWeb": true, "shopBatch": true, "outsider": false},
		},
		{
			name:     "ipBlock: any address in the cidr, pods and outsiders",
			policies: []networkingv1.NetworkPolicy{policy("ip").Selecting().Ingress(rule(peers(block("10.244.2.0/24")))).Obj()},
			want:     map[string]bool{"frontend": false, "shopWeb": true, "shopBatch": true, "outsider": false},
		},
		{
			name:     "ipBlock except",
			policies: []networkingv1.NetworkPolicy{policy("ip").Selecting().Ingress(rule(peers(block("10.244.0.0/16", "10.244.2.8/29")))).Obj()},
			want:     map[string]bool{"frontend": true, "shopWeb": false, "shopBatch": false},
		},
		{
			name:     "ipBlock admits an address that is no pod",
			policies: []networkingv1.NetworkPolicy{policy("lan").Selecting().Ingress(rule(peers(block("192.168.0.0/16")))).Obj()},
			want:     map[string]bool{"outsider": true, "frontend": false},
		},
		{
			name:     "ports: the numbered port only",
			policies: []networkingv1.NetworkPolicy{policy("port").Selecting().Ingress(rule(nil, port(8080))).Obj()},
			checks:   map[string]check{"8080": {client: frontend, port: 8080}, "9090": {client: frontend, port: 9090}},
			want:     map[string]bool{"8080": true, "9090": false},
		},
		{
			name:     "ports: endPort range, inclusive",
			policies: []networkingv1.NetworkPolicy{policy("range").Selecting().Ingress(rule(nil, portRange(8000, 8080))).Obj()},
			checks: map[string]check{"7999": {client: frontend, port: 7999}, "8000": {client: frontend, port: 8000},
				"8080": {client: frontend, port: 8080}, "8081": {client: frontend, port: 8081}},
			want: map[string]bool{"7999": false, "8000": true, "8080": true, "8081": false},
		},
		{
			name:     "ports: a named port resolved against the pod's container ports",
			policies: []networkingv1.NetworkPolicy{policy("named").Selecting().Ingress(rule(nil, namedPort("http"))).Obj()},
			checks:   map[string]check{"8080": {client: frontend, port: 8080}, "9090": {client: frontend, port: 9090}},
			want:     map[string]bool{"8080": true, "9090": false},
		},
		{
			name:     "ports: a name the pod does not have matches nothing",
			policies: []networkingv1.NetworkPolicy{policy("named").Selecting().Ingress(rule(nil, namedPort("grpc"))).Obj()},
			checks:   map[string]check{"8080": {client: frontend, port: 8080}},
			want:     map[string]bool{"8080": false},
		},
		{
			name:     "ports: protocol TCP by default, UDP does not admit TCP",
			policies: []networkingv1.NetworkPolicy{policy("udp").Selecting().Ingress(rule(nil, udp(port(8080)))).Obj()},
			checks: map[string]check{"tcp": {client: frontend, port: 8080},
				"udp": {client: frontend, port: 8080, proto: corev1.ProtocolUDP}},
			want: map[string]bool{"tcp": false, "udp": true},
		},
		{
			name:     "ports: explicit TCP, and a protocol alone means all its ports",
			policies: []networkingv1.NetworkPolicy{policy("tcp").Selecting().Ingress(rule(nil, tcp(networkingv1.NetworkPolicyPort{}))).Obj()},
			checks:   map[string]check{"8080": {client: frontend, port: 8080}, "9": {client: frontend, port: 9}},
			want:     map[string]bool{"8080": true, "9": true},
		},
		{
			name: "a rule needs both its from and its ports",
			policies: []networkingv1.NetworkPolicy{policy("fe").Selecting().
				Ingress(rule(peers(pods("role", "frontend")), port(9090))).Obj()},
			checks: map[string]check{"frontend 8080": {client: frontend, port: 8080}, "frontend 9090": {client: frontend, port: 9090},
				"shopWeb 9090": {client: shopWeb, port: 9090}},
			want: map[string]bool{"frontend 8080": false, "frontend 9090": true, "shopWeb 9090": false},
		},
		{
			name: "several policies: the union of what they admit",
			policies: []networkingv1.NetworkPolicy{
				policy("deny").Selecting().Obj(),
				policy("fe").Selecting("app", "hello").Ingress(rule(peers(pods("role", "frontend")))).Obj(),
				policy("lan").Selecting("app", "hello").Ingress(rule(peers(block("192.168.0.0/16")))).Obj(),
				policy("other-pods").Selecting("app", "other").Ingress(rule(nil)).Obj(),
			},
			want: map[string]bool{"frontend": true, "outsider": true, "shopWeb": false},
		},
		{
			name: "several rules of one policy: the union",
			policies: []networkingv1.NetworkPolicy{policy("two").Selecting().
				Ingress(rule(peers(pods("role", "frontend"))), rule(peers(namespaces("tier", "web")), port(8080))).Obj()},
			want: map[string]bool{"frontend": true, "shopWeb": true, "outsider": false},
		},
		{
			name: "matchExpressions",
			policies: []networkingv1.NetworkPolicy{policy("expr").Selecting().Ingress(rule(peers(networkingv1.NetworkPolicyPeer{
				NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
					{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"team"}}}}}))).Obj()},
			want: map[string]bool{"frontend": false, "shopWeb": true, "outsider": false},
		},
	}
	named := map[string]Client{"frontend": frontend, "shopWeb": shopWeb, "shopBatch": shopBatch, "outsider": outsider}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := map[string]bool{}
			for name := range tt.want {
				c, ok := tt.checks[name]
				if !ok {
					c = check{client: named[name], port: 8080}
				}
				proto := c.proto
				if proto == "" {
					proto = corev1.ProtocolTCP
				}
				got[name] = Admits(tt.policies, dest, c.port, proto, c.client)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("admitted (-want +got):\n%s", diff)
			}
		})
	}
}

// BenchmarkAdmits is the evaluator's share of a forward in a namespace
// with ten policies, the admitting one last.
func BenchmarkAdmits(b *testing.B) {
	var policies []networkingv1.NetworkPolicy
	for i := range 9 {
		policies = append(policies, policy(fmt.Sprint("p", i)).Selecting("app", "hello").
			Ingress(rule(peers(both(sel("tier", "web"), sel("role", fmt.Sprint("r", i)))), namedPort("http"))).Obj())
	}
	policies = append(policies, policy("fe").Selecting("app", "hello").Ingress(rule(peers(pods("role", "frontend")), port(8080))).Obj())
	for b.Loop() {
		if !Admits(policies, dest, 8080, corev1.ProtocolTCP, frontend) {
			b.Fatal("not admitted")
		}
	}
}

// TestMatchesAsKubernetes: matches agrees with the selectors Kubernetes
// builds (metav1.LabelSelectorAsSelector), and selects nothing where
// Kubernetes refuses the selector.
func TestMatchesAsKubernetes(t *testing.T) {
	req := func(key string, op metav1.LabelSelectorOperator, values ...string) metav1.LabelSelectorRequirement {
		return metav1.LabelSelectorRequirement{Key: key, Operator: op, Values: values}
	}
	selectors := []*metav1.LabelSelector{
		{},
		sel("app", "hello"),
		sel("app", "hello", "tier", "web"),
		sel("app", ""),
		{MatchExpressions: []metav1.LabelSelectorRequirement{req("app", metav1.LabelSelectorOpIn, "hello", "other")}},
		{MatchExpressions: []metav1.LabelSelectorRequirement{req("app", metav1.LabelSelectorOpNotIn, "hello")}},
		{MatchExpressions: []metav1.LabelSelectorRequirement{req("tier", metav1.LabelSelectorOpExists)}},
		{MatchExpressions: []metav1.LabelSelectorRequirement{req("tier", metav1.LabelSelectorOpDoesNotExist)}},
		{MatchLabels: map[string]string{"app": "hello"}, MatchExpressions: []metav1.LabelSelectorRequirement{req("tier", metav1.LabelSelectorOpNotIn, "web", "db")}},
		// Refused by Kubernetes: must select nothing.
		{MatchExpressions: []metav1.LabelSelectorRequirement{req("app", metav1.LabelSelectorOpIn)}},
		{MatchExpressions: []metav1.LabelSelectorRequirement{req("app", metav1.LabelSelectorOpNotIn)}},
		{MatchExpressions: []metav1.LabelSelectorRequirement{req("app", metav1.LabelSelectorOpExists, "x")}},
		{MatchExpressions: []metav1.LabelSelectorRequirement{req("app", metav1.LabelSelectorOpDoesNotExist, "x")}},
		{MatchExpressions: []metav1.LabelSelectorRequirement{req("app", "Near", "x")}},
	}
	sets := []map[string]string{nil, {"app": "hello"}, {"app": "other"}, {"app": ""}, {"app": "hello", "tier": "web"}, {"tier": "db"}, {"app": "hello", "tier": "cache"}}
	for i, s := range selectors {
		k8s, err := metav1.LabelSelectorAsSelector(s)
		for _, set := range sets {
			want := err == nil && k8s.Matches(labels.Set(set))
			if got := matches(s, set); got != want {
				t.Errorf("selector %d %v on %v: %v, Kubernetes says %v (selector error %v)", i, s, set, got, want, err)
			}
		}
	}
}
