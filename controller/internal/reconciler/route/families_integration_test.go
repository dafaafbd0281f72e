package route_test

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/route"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationRouteAddressFamilies: in a dual-stack cluster whose
// primary family is IPv6, a Route's address Service is made dual-stack
// (PreferDualStack), IPv6 first: its IPv6 slice, named -sockscale-v6-0,
// lists the activators' IPv6 addresses, and its IPv4 slice beside it,
// under the name IPv4 slices always had, their IPv4 ones; made IPv6-only
// (as a user may), it loses the IPv4 slice and keeps that choice; made
// dual-stack again, it gets it back.
func TestIntegrationRouteAddressFamilies(t *testing.T) {
	cl := testenv.ControlPlane(t, testenv.DualStackIPv6First())
	c, ctx := cl.Client, context.Background()
	cl.StartManager(t, func(mgr ctrl.Manager) error {
		return (&route.Reconciler{Client: mgr.GetClient(), ActivatorNamespace: "sockscale-system", ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}),
			ActivatorRoutePort: 8013, ClusterDomain: "cluster.local"}).SetupWithManager(mgr)
	})
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "sockscale-system"}}); err != nil {
		t.Fatal(err)
	}
	act := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "sockscale-system", Name: "activator-0", Labels: map[string]string{"app": "activator"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Image: "activator"}}}}
	if err := c.Create(ctx, act); err != nil {
		t.Fatal(err)
	}
	act.Status = corev1.PodStatus{PodIP: "fd00:9::7", PodIPs: []corev1.PodIP{{IP: "fd00:9::7"}, {IP: "10.9.0.7"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := c.Status().Update(ctx, act); err != nil {
		t.Fatal(err)
	}
	readyRevision(t, c, "hello-00001")
	rt := &servingv1alpha1.Route{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "split"},
		Spec: servingv1alpha1.RouteSpec{Traffic: []servingv1alpha1.TrafficTarget{{RevisionName: "hello-00001", Percent: pct(100)}}}}
	if err := c.Create(ctx, rt); err != nil {
		t.Fatal(err)
	}
	sliceHas := func(name string, family discoveryv1.AddressType, addr string) func() (bool, string) {
		return func() (bool, string) {
			var es discoveryv1.EndpointSlice
			err := c.Get(ctx, key(name), &es)
			return err == nil && es.AddressType == family && len(es.Endpoints) == 1 && es.Endpoints[0].Addresses[0] == addr &&
				*es.Ports[0].Port == 8013, fmt.Sprintf("%v %s %+v", err, es.AddressType, es.Endpoints)
		}
	}
	gone := func(name string) func() (bool, string) {
		return func() (bool, string) {
			var es discoveryv1.EndpointSlice
			err := c.Get(ctx, key(name), &es)
			return apierrors.IsNotFound(err), fmt.Sprintf("%v", err)
		}
	}
	eventually(t, "the IPv6 slice of the address Service", sliceHas("split-sockscale-v6-0", discoveryv1.AddressTypeIPv6, "fd00:9::7"))
	eventually(t, "the IPv4 slice beside it", sliceHas("split-sockscale-0", discoveryv1.AddressTypeIPv4, "10.9.0.7"))
	var made corev1.Service
	if err := c.Get(ctx, key("split"), &made); err != nil {
		t.Fatal(err)
	}
	if p := made.Spec.IPFamilyPolicy; p == nil || *p != corev1.IPFamilyPolicyPreferDualStack || len(made.Spec.ClusterIPs) != 2 {
		t.Errorf("address Service made with policy %v and cluster IPs %v, want PreferDualStack and one per family", p, made.Spec.ClusterIPs)
	}

	setFamilies := func(policy corev1.IPFamilyPolicy, families ...corev1.IPFamily) {
		t.Helper()
		var s corev1.Service
		if err := c.Get(ctx, key("split"), &s); err != nil {
			t.Fatal(err)
		}
		s.Spec.IPFamilyPolicy, s.Spec.IPFamilies = &policy, families
		if len(families) == 1 {
			s.Spec.ClusterIPs = s.Spec.ClusterIPs[:1]
		}
		if err := c.Update(ctx, &s); err != nil {
			t.Fatal(err)
		}
	}
	setFamilies(corev1.IPFamilyPolicySingleStack, corev1.IPv6Protocol)
	eventually(t, "the IPv4 slice gone with the family", gone("split-sockscale-0"))
	eventually(t, "the IPv6 slice kept", sliceHas("split-sockscale-v6-0", discoveryv1.AddressTypeIPv6, "fd00:9::7"))
	if err := c.Get(ctx, key("split"), &made); err != nil {
		t.Fatal(err)
	}
	if p := made.Spec.IPFamilyPolicy; p == nil || *p != corev1.IPFamilyPolicySingleStack {
		t.Errorf("address Service's policy %v after the user made it single-stack, want SingleStack kept", p)
	}
	setFamilies(corev1.IPFamilyPolicyPreferDualStack, corev1.IPv6Protocol, corev1.IPv4Protocol)
	eventually(t, "the IPv4 slice back beside the IPv6 one", sliceHas("split-sockscale-0", discoveryv1.AddressTypeIPv4, "10.9.0.7"))
}
