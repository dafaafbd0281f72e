package netpol_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/activator/internal/cachetrim"
	"github.com/sockscale/sockscale/activator/internal/netpol"
	"github.com/sockscale/sockscale/activator/internal/target"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationPoliciesDecide runs the Admitter on a real
// kube-apiserver, under exactly the rules its markers generate and on the
// activator's trimmed cache: pods, namespaces and NetworkPolicies created
// and changed through the API change whether a client may reach team's
// pod hello-1 on port 8080.
func TestIntegrationPoliciesDecide(t *testing.T) {
	cl := testenv.ControlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := cl.Client
	create := func(objs ...client.Object) {
		t.Helper()
		for _, o := range objs {
			if err := c.Create(ctx, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	create(namespace("team"), namespace("shop"), namespace("other"))
	// A pod gets its address and phase from its kubelet, which envtest
	// has not: the test writes the status.
	runPod := func(ns, name, ip string, labels map[string]string) *corev1.Pod {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}}}
		create(p)
		p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
		if err := c.Status().Update(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	runPod("team", "hello-1", "10.244.1.7", map[string]string{"app": "hello"})
	runPod("shop", "web", "10.244.2.1", map[string]string{"role": "frontend"})
	otherPod := runPod("other", "web", "10.244.3.1", map[string]string{"role": "frontend"})

	cfg := cl.ConfigAs(t, "activator", testenv.GeneratedRules(t, "activator/role.yaml"))
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	opts := cachetrim.Options()
	opts.Scheme = scheme
	ca, err := cache.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = ca.Start(ctx) }()
	a := netpol.New(netpol.Options{Reader: ca})
	if err := a.Admit(ctx, netip.MustParseAddr("10.244.2.1"), hello, pod8080); !errors.Is(err, netpol.ErrUndecided) {
		t.Errorf("before Run: %v, want ErrUndecided", err)
	}
	if err := a.Run(ctx, ca); err != nil {
		t.Fatal(err)
	}

	// decisions are the Admitter's answers for shop/web, other/web and an
	// address that is no pod.
	decisions := func() string {
		var s string
		for _, client := range []string{"10.244.2.1", "10.244.3.1", "192.168.1.1"} {
			err := a.Admit(ctx, netip.MustParseAddr(client), hello, pod8080)
			switch {
			case err == nil:
				s += " admitted"
			case errors.Is(err, netpol.ErrDenied):
				s += " denied"
			default:
				s += " " + err.Error()
			}
		}
		return s[1:]
	}
	expect := func(what, want string) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, what, func() (bool, string) {
			got := decisions()
			return got == want, fmt.Sprintf("shop/web, other/web, 192.168.1.1: %s; want %s", got, want)
		})
	}
	expect("no policy: everyone", "admitted admitted admitted")

	create(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "deny"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}})
	expect("deny all: nobody", "denied denied denied")

	create(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "hello"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "web"}},
					PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "frontend"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr.To(intstr.FromString("http"))}},
			}}}})
	expect("no namespace labelled tier=web yet", "denied denied denied")

	ns := &corev1.Namespace{}
	if err := c.Get(ctx, client.ObjectKey{Name: "shop"}, ns); err != nil {
		t.Fatal(err)
	}
	ns.Labels["tier"] = "web"
	if err := c.Update(ctx, ns); err != nil {
		t.Fatal(err)
	}
	expect("shop labelled tier=web: its frontend", "admitted denied denied")

	create(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "lan"},
		Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "192.168.0.0/16"}}}}}}})
	expect("an ipBlock adds the address that is no pod", "admitted denied admitted")

	if err := c.Get(ctx, client.ObjectKey{Name: "other"}, ns); err != nil {
		t.Fatal(err)
	}
	ns.Labels["tier"] = "web"
	if err := c.Update(ctx, ns); err != nil {
		t.Fatal(err)
	}
	expect("other labelled tier=web too: its frontend", "admitted admitted admitted")

	otherPod.Labels["role"] = "batch"
	if err := c.Update(ctx, otherPod); err != nil {
		t.Fatal(err)
	}
	expect("other's pod relabelled: no frontend", "admitted denied admitted")

	if err := c.Delete(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "deny"}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web"}}); err != nil {
		t.Fatal(err)
	}
	expect("the lan policy alone: only the ipBlock", "denied denied admitted")
}

var (
	hello   = target.Key{Namespace: "team", Name: "hello"}
	pod8080 = netip.MustParseAddrPort("10.244.1.7:8080")
)

func namespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}
