package endpointwatch

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// Under exactly the rules the agent's markers generate, the watch syncs
// against a real kube-apiserver and follows a slice's endpoint from ready
// to terminating.
func TestIntegrationEndpointWatchUnderItsGeneratedRole(t *testing.T) {
	cl := testenv.ControlPlane(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := cl.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns"}}); err != nil {
		t.Fatal(err)
	}
	s := slice("web-abcde", map[string]string{discoveryv1.LabelServiceName: "web"}, ep{ip: "10.0.0.1", node: node, ready: yes})
	if err := cl.Client.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cl.ConfigAs(t, "agent", testenv.GeneratedRules(t, "agent/role.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	w := New(nil)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, client, node) }()
	testenv.Eventually(t, 20*time.Second, "the pod routed", func() (bool, string) {
		st := w.Of("ns", pod)
		return st.Known && st.Routed, "not yet"
	})
	s.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: no, Serving: yes, Terminating: yes}
	if err := cl.Client.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, "the pod no longer routed", func() (bool, string) {
		st := w.Of("ns", pod)
		return !st.Routed && !st.Since.IsZero(), "still routed"
	})
	cancel()
	if err := <-done; err != nil {
		t.Error(err)
	}
}
