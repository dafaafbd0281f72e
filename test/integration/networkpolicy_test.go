package integration

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// The chart's NetworkPolicies, with every optional peer kind set, are
// valid to a real kube-apiserver: created with strict field validation (an
// unknown or misplaced field is an error, not dropped) and read back with
// the rules they were rendered with.
func TestIntegrationNetworkPoliciesValid(t *testing.T) {
	c := testenv.ControlPlane(t)
	ctx := context.Background()
	const ns = "sockscale-system"
	if err := c.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	for _, set := range [][]string{
		{"--set", "networkPolicy.enabled=true", "--set", "agent.hostNetwork=true", "--set", "fullnameOverride=hostnet"},
		{"--set", "networkPolicy.enabled=true",
			"--set-json", `networkPolicy.metricsFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}},"podSelector":{"matchLabels":{"app":"prometheus"}}}]`,
			"--set-json", `networkPolicy.agentMetricsFrom=[{"ipBlock":{"cidr":"10.0.0.0/8","except":["10.1.0.0/16"]}}]`},
	} {
		n := 0
		for _, o := range renderChart(t, ns, set...) {
			if o.GetKind() != "NetworkPolicy" {
				continue
			}
			n++
			rendered := o.DeepCopy()
			if err := c.Client.Create(ctx, o, client.FieldValidation("Strict")); err != nil {
				t.Fatalf("create NetworkPolicy %s (%v): %v", o.GetName(), set, err)
			}
			want, _, _ := unstructured.NestedSlice(rendered.Object, "spec", "ingress")
			got, _, _ := unstructured.NestedSlice(o.Object, "spec", "ingress")
			if len(want) != len(got) {
				t.Errorf("%s: %d ingress rules stored, %d rendered", o.GetName(), len(got), len(want))
			}
		}
		if n != 3 {
			t.Errorf("%v: %d NetworkPolicies rendered, want 3 (controller, activator, agent)", set, n)
		}
	}
}
