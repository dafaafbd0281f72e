package podindex

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// TestTrimKeepsWhatRecordsAreCheckedWith: a trimmed pod has its name,
// labels, node and address, and none of its containers, annotations or
// conditions; a tombstone passes through.
func TestTrimKeepsWhatRecordsAreCheckedWith(t *testing.T) {
	full := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "shop", UID: "u1", ResourceVersion: "7",
			Labels: map[string]string{"app": "web"}, Annotations: map[string]string{"big": "x"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "app", Image: "web:1"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7", PodIPs: []corev1.PodIP{{IP: "10.0.0.7"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	out, err := Trim(full)
	if err != nil {
		t.Fatal(err)
	}
	p := out.(*corev1.Pod)
	if p.Name != "web-1" || p.Namespace != "shop" || p.Labels["app"] != "web" || p.Spec.NodeName != "node-a" || p.Status.PodIP != "10.0.0.7" {
		t.Errorf("trimmed pod lost what records are checked with: %+v", p)
	}
	if len(p.Spec.Containers) != 0 || len(p.Annotations) != 0 || len(p.ManagedFields) != 0 || len(p.Status.Conditions) != 0 {
		t.Errorf("trimmed pod kept what nothing reads: %+v", p)
	}
	if got := of(p); got != (Pod{Name: "web-1", Node: "node-a", IP: netip.MustParseAddr("10.0.0.7")}) {
		t.Errorf("of = %+v", got)
	}
	if got := of(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pending"}}); got.IP.IsValid() || got.Node != "" {
		t.Errorf("a pod without node or address: %+v, want neither", got)
	}
	// Dual-stack pods are known by their IPv4 address whichever family is
	// primary (listed first); IPv6-only pods by their IPv6 one.
	for _, tc := range []struct {
		podIPs []string
		want   string
	}{
		{[]string{"fd00::7", "10.0.0.7"}, "10.0.0.7"},
		{[]string{"10.0.0.7", "fd00::7"}, "10.0.0.7"},
		{[]string{"fd00::7"}, "fd00::7"},
	} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-1"}, Spec: corev1.PodSpec{NodeName: "node-a"},
			Status: corev1.PodStatus{PodIP: tc.podIPs[0]}}
		for _, ip := range tc.podIPs {
			pod.Status.PodIPs = append(pod.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		trimmed, _ := Trim(pod)
		if got := of(trimmed.(*corev1.Pod)); got.IP != netip.MustParseAddr(tc.want) {
			t.Errorf("pod IPs %v: address %v, want %s", tc.podIPs, got.IP, tc.want)
		}
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "shop/web-1"}
	if out, _ := Trim(tomb); out != tomb {
		t.Errorf("tombstone changed: %v", out)
	}
}
