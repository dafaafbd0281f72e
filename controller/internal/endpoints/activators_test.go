package endpoints

import (
	"context"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// TestReadyActivators: a ready activator with an address of either
// family is one, known by its IPv4 address if it has one and carrying
// all of them; one without an address, not ready or deleting is not.
func TestReadyActivators(t *testing.T) {
	activator := func(name string, ready bool, ips ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "sockscale-system", Name: name, Labels: map[string]string{"app": "activator"}}}
		if len(ips) > 0 {
			p.Status.PodIP = ips[0]
		}
		for _, ip := range ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}
		return p
	}
	objs := []client.Object{
		activator("v4", true, "10.0.0.1"),
		activator("v6", true, "fd00::2"),
		activator("dual-v6-first", true, "fd00::3", "10.0.0.3"),
		activator("no-address", true),
		activator("not-ready", false, "10.0.0.5"),
	}
	c := fake.NewClientBuilder().WithObjects(objs...).Build()
	got, err := ReadyActivators(context.Background(), c, "sockscale-system", labels.SelectorFromSet(labels.Set{"app": "activator"}))
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr
	want := []Endpoint{
		{Name: "dual-v6-first", IP: a("10.0.0.3"), Addrs: []netip.Addr{a("fd00::3"), a("10.0.0.3")}},
		{Name: "v4", IP: a("10.0.0.1"), Addrs: []netip.Addr{a("10.0.0.1")}},
		{Name: "v6", IP: a("fd00::2"), Addrs: []netip.Addr{a("fd00::2")}},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
		t.Errorf("ready activators (-want +got):\n%s", diff)
	}
}
