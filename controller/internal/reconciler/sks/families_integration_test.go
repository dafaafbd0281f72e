package sks_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/sks"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationSlicesPerFamily: against an API server with an IPv4 and
// an IPv6 Service range, a dual-stack public Service gets a private
// Service of both families and sockscale's slices of both (IPv4 under
// the names they always had, IPv6 under -sockscale-v6-), each with the
// activators' or the pods' addresses of its family; an IPv6-only one
// gets IPv6 slices only; and a dual-stack Service made single-stack
// loses its IPv6 slices and its private Service its IPv6 family.
func TestIntegrationSlicesPerFamily(t *testing.T) {
	cl := testenv.ControlPlane(t, testenv.DualStack())
	c := cl.Client
	ctx := context.Background()
	cl.StartManager(t, func(mgr ctrl.Manager) error {
		return (&sks.ServerlessService{Client: mgr.GetClient(), ActivatorNamespace: "default",
			ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}), ActivatorPort: 8012}).SetupWithManager(mgr)
	})
	// A dual-stack activator pod, ready (no kubelet runs here: the test
	// writes its status).
	act := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "activator-0", Labels: map[string]string{"app": "activator"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "activator", Image: "activator"}}}}
	if err := c.Create(ctx, act); err != nil {
		t.Fatal(err)
	}
	act.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.2.10", PodIPs: []corev1.PodIP{{IP: "10.244.2.10"}, {IP: "fd00:2::10"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := c.Status().Update(ctx, act); err != nil {
		t.Fatal(err)
	}

	public := func(name string, policy corev1.IPFamilyPolicy, families ...corev1.IPFamily) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}, IPFamilyPolicy: &policy, IPFamilies: families}}
	}
	// podSlice is a private Service's slice as Kubernetes' EndpointSlice
	// controller would write it (it does not run here).
	podSlice := func(svc string, family discoveryv1.AddressType, addr string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: svc + "-private-" + strings.ToLower(string(family)), Labels: map[string]string{
				discoveryv1.LabelServiceName: svc + "-private", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
			AddressType: family,
			Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(corev1.ProtocolTCP)}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: svc + "-abc"}}},
		}
	}
	serverless := func(name string, mode v1alpha1.Mode) *v1alpha1.ServerlessService {
		return &v1alpha1.ServerlessService{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: v1alpha1.ServerlessServiceSpec{Mode: mode, NumActivators: 1, PublicService: name, Selector: map[string]string{"app": name}}}
	}
	for _, o := range []client.Object{
		public("dual", corev1.IPFamilyPolicyRequireDualStack, corev1.IPv4Protocol, corev1.IPv6Protocol),
		podSlice("dual", discoveryv1.AddressTypeIPv4, "10.244.1.5"), podSlice("dual", discoveryv1.AddressTypeIPv6, "fd00:1::5"),
		serverless("dual", v1alpha1.ModeServe),
		public("six", corev1.IPFamilyPolicySingleStack, corev1.IPv6Protocol),
		podSlice("six", discoveryv1.AddressTypeIPv6, "fd00:1::6"),
		serverless("six", v1alpha1.ModeProxy),
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// slicesOf are Service svc's slices sockscale wrote: name, address
	// type and addresses.
	slicesOf := func(svc string) ([]string, error) {
		var list discoveryv1.EndpointSliceList
		if err := c.List(ctx, &list, client.InNamespace("default"), client.MatchingLabels{discoveryv1.LabelServiceName: svc}); err != nil {
			return nil, err
		}
		var out []string
		for _, s := range list.Items {
			if !strings.HasPrefix(s.Name, svc+"-sockscale-") {
				continue
			}
			var addrs []string
			for _, e := range s.Endpoints {
				addrs = append(addrs, e.Addresses...)
			}
			out = append(out, fmt.Sprintf("%s %s %s", s.Name, s.AddressType, strings.Join(addrs, ",")))
		}
		slices.Sort(out)
		return out, nil
	}
	slicesAre := func(svc string, want ...string) func() (bool, string) {
		return func() (bool, string) {
			got, err := slicesOf(svc)
			if err != nil {
				return false, err.Error()
			}
			return cmp.Equal(want, got), fmt.Sprintf("slices %q, want %q", got, want)
		}
	}
	privateFamilies := func(svc string, want ...corev1.IPFamily) func() (bool, string) {
		return func() (bool, string) {
			var p corev1.Service
			if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: svc + "-private"}, &p); err != nil {
				return false, err.Error()
			}
			return slices.Equal(p.Spec.IPFamilies, want), fmt.Sprintf("private Service's families %v, want %v", p.Spec.IPFamilies, want)
		}
	}

	testenv.Eventually(t, 30*time.Second, "a dual-stack private Service", privateFamilies("dual", corev1.IPv4Protocol, corev1.IPv6Protocol))
	testenv.Eventually(t, 30*time.Second, "Serve: the pod's address of each family",
		slicesAre("dual", "dual-sockscale-0 IPv4 10.244.1.5", "dual-sockscale-v6-0 IPv6 fd00:1::5"))
	// An IPv6-only public Service's private one prefers dual-stack, IPv6
	// first: the agents report dual-stack pods by their IPv4 address,
	// which only the private Service's IPv4 slices show the controller.
	testenv.Eventually(t, 30*time.Second, "a private Service of both families for an IPv6-only one", privateFamilies("six", corev1.IPv6Protocol, corev1.IPv4Protocol))
	testenv.Eventually(t, 30*time.Second, "Proxy, IPv6-only: the activator's IPv6 address", slicesAre("six", "six-sockscale-v6-0 IPv6 fd00:2::10"))
	// ... and is left alone from then on: the second family the API
	// server added is no reason to update it.
	var six corev1.Service
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "six-private"}, &six); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(ctx, podSlice("six", discoveryv1.AddressTypeIPv4, "10.244.1.6")); err != nil { // a reconcile of "six"
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	var again corev1.Service
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "six-private"}, &again); err != nil {
		t.Fatal(err)
	}
	if again.ResourceVersion != six.ResourceVersion || ptr.Deref(again.Spec.IPFamilyPolicy, "") != corev1.IPFamilyPolicyPreferDualStack {
		t.Errorf("the IPv6-only Service's private one: resourceVersion %s -> %s, policy %v; want it unchanged, PreferDualStack",
			six.ResourceVersion, again.ResourceVersion, ptr.Deref(again.Spec.IPFamilyPolicy, ""))
	}
	testenv.Eventually(t, 30*time.Second, "Proxy, IPv6-only: still the activator's IPv6 address only", slicesAre("six", "six-sockscale-v6-0 IPv6 fd00:2::10"))

	var s v1alpha1.ServerlessService
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "dual"}, &s); err != nil {
		t.Fatal(err)
	}
	s.Spec.Mode = v1alpha1.ModeProxy
	if err := c.Update(ctx, &s); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "Proxy, dual-stack: the activator's address of each family",
		slicesAre("dual", "dual-sockscale-0 IPv4 10.244.2.10", "dual-sockscale-v6-0 IPv6 fd00:2::10"))

	var svc corev1.Service
	if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: "dual"}, &svc); err != nil {
		t.Fatal(err)
	}
	svc.Spec.IPFamilyPolicy, svc.Spec.IPFamilies, svc.Spec.ClusterIPs = ptr.To(corev1.IPFamilyPolicySingleStack), []corev1.IPFamily{corev1.IPv4Protocol}, svc.Spec.ClusterIPs[:1]
	if err := c.Update(ctx, &svc); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "single-stack again: the IPv6 slice goes", slicesAre("dual", "dual-sockscale-0 IPv4 10.244.2.10"))
	testenv.Eventually(t, 30*time.Second, "the private Service single-stack too", privateFamilies("dual", corev1.IPv4Protocol))
}
