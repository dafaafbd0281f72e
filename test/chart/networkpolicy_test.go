package chart_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ingressPorts maps each port of a policy's ingress rules to its peers
// (nil: anyone).
func ingressPorts(np *networkingv1.NetworkPolicy) map[int32][]networkingv1.NetworkPolicyPeer {
	out := map[int32][]networkingv1.NetworkPolicyPeer{}
	for _, r := range np.Spec.Ingress {
		for _, p := range r.Ports {
			out[p.Port.IntVal] = r.From
		}
	}
	return out
}

// selects is a peer of the release's pods of component: a podSelector
// alone (no namespaceSelector) matches pods of the policy's own namespace,
// the release's, where tenants create no pods, so its labels cannot be
// forged.
func selects(component string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
		"app.kubernetes.io/name": "sockscale", "app.kubernetes.io/instance": release, "app.kubernetes.io/component": component}}}
}

func TestNetworkPolicies(t *testing.T) {
	if n := len(render(t, "--set", "networkPolicy.enabled=false").ofKind("NetworkPolicy")); n != 0 {
		t.Errorf("%d NetworkPolicies with networkPolicy.enabled=false, want none", n)
	}
	monitoring := networkingv1.NetworkPolicyPeer{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}}
	nodes := networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16"}}
	for _, tt := range []struct {
		name string
		set  []string
		want map[string]map[int32][]networkingv1.NetworkPolicyPeer // by policy name, port
	}{
		// On by default: where the network plugin enforces them.
		{"defaults", nil, map[string]map[int32][]networkingv1.NetworkPolicyPeer{
			controllerName: {8443: {selects("agent"), selects("activator")}, 8080: nil, 8081: nil},
			activatorName:  {8012: nil, 8013: nil, 8081: nil, 9090: nil},
			agentName:      {9090: nil, 8081: nil},
		}},
		{"metrics from monitoring, agents' from the nodes", []string{"--set", "networkPolicy.enabled=true",
			"--set-json", `networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]`,
			"--set-json", `networkPolicy.agentMetricsFrom=[{"ipBlock":{"cidr":"10.0.0.0/16"}}]`}, map[string]map[int32][]networkingv1.NetworkPolicyPeer{
			controllerName: {8443: {selects("agent"), selects("activator")}, 8080: {monitoring}, 8081: nil},
			activatorName:  {8012: nil, 8013: nil, 8081: nil, 9090: {monitoring}},
			agentName:      {9090: {nodes}, 8081: nil},
		}},
		{"no activator", []string{"--set", "networkPolicy.enabled=true,activator.enabled=false"}, map[string]map[int32][]networkingv1.NetworkPolicyPeer{
			controllerName: {8443: {selects("agent")}, 8080: nil, 8081: nil},
			agentName:      {9090: nil, 8081: nil},
		}},
		// A hostNetwork agent sends from its node's address: no pod
		// selector matches it, so the stats port stays open.
		{"hostNetwork agent", []string{"--set", "networkPolicy.enabled=true,agent.hostNetwork=true"}, map[string]map[int32][]networkingv1.NetworkPolicyPeer{
			controllerName: {8443: nil, 8080: nil, 8081: nil},
			activatorName:  {8012: nil, 8013: nil, 8081: nil, 9090: nil},
			agentName:      {9090: nil, 8081: nil},
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			objs := render(t, tt.set...)
			got := map[string]map[int32][]networkingv1.NetworkPolicyPeer{}
			for _, o := range objs.ofKind("NetworkPolicy") {
				np := get[networkingv1.NetworkPolicy](t, objs, "NetworkPolicy", o.Name)
				if len(np.Spec.PolicyTypes) != 1 || np.Spec.PolicyTypes[0] != networkingv1.PolicyTypeIngress {
					t.Errorf("%s policyTypes %v, want [Ingress] (egress stays open: the API server, DNS, the pods)", o.Name, np.Spec.PolicyTypes)
				}
				component := map[string]string{controllerName: "controller", activatorName: "activator", agentName: "agent"}[o.Name]
				if diff := cmp.Diff(selects(component).PodSelector, &np.Spec.PodSelector); diff != "" {
					t.Errorf("%s podSelector (-want +got):\n%s", o.Name, diff)
				}
				if np.Namespace != namespace {
					t.Errorf("%s in namespace %q, want the release's %q (its pod selectors match there only)", o.Name, np.Namespace, namespace)
				}
				got[o.Name] = ingressPorts(np)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ingress by policy and port (-want +got):\n%s", diff)
			}
		})
	}
}
