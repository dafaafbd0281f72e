package endpointwatch

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

const node = "node-a"

type ep struct {
	ip, node           string
	ready, terminating *bool
}

func slice(name string, labels map[string]string, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: labels}, AddressType: discoveryv1.AddressTypeIPv4}
	for _, e := range eps {
		d := discoveryv1.Endpoint{Addresses: []string{e.ip}, Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Terminating: e.terminating}}
		if e.node != "" {
			d.NodeName = ptr.To(e.node)
		}
		s.Endpoints = append(s.Endpoints, d)
	}
	return s
}

var (
	yes = ptr.To(true)
	no  = ptr.To(false)
	pod = netip.MustParseAddr("10.0.0.1")
)

// A leaving pod is routed while any slice lists it as ready: the private
// Service's and the public Service's mirror of it alike; it stops being
// routed when the last one drops it, and Since says when.
func TestRoutedUntilTheLastSliceDropsIt(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	w := New(clk)
	if st := w.Of("ns", pod); st.Routed || !st.Since.IsZero() {
		t.Fatalf("before any slice: %+v, want not routed, never was", st)
	}
	w.Update(slice("private", nil, ep{ip: "10.0.0.1", node: node, ready: yes}, ep{ip: "10.0.0.2", node: node, ready: yes}), node)
	w.Update(slice("public", nil, ep{ip: "10.0.0.1", node: node, ready: yes}), node)
	if st := w.Of("ns", pod); !st.Routed || !slices.Equal(sorted(st.Slices), []string{"ns/private", "ns/public"}) {
		t.Fatalf("listed ready by two slices: %+v", st)
	}
	clk.SetTime(time.Unix(1001, 0))
	w.Update(slice("private", nil, ep{ip: "10.0.0.1", node: node, ready: no, terminating: yes}, ep{ip: "10.0.0.2", node: node, ready: yes}), node)
	if st := w.Of("ns", pod); !st.Routed || !slices.Equal(st.Slices, []string{"ns/public"}) {
		t.Fatalf("the public mirror not yet updated: %+v, want routed by ns/public", st)
	}
	clk.SetTime(time.Unix(1002, 0))
	w.Update(slice("public", nil, ep{ip: "10.0.0.1", node: node, ready: no, terminating: yes}), node)
	if st := w.Of("ns", pod); st.Routed || !st.Since.Equal(time.Unix(1002, 0)) {
		t.Fatalf("dropped by both: %+v, want not routed since 1002", st)
	}
	if st := w.Of("ns", netip.MustParseAddr("10.0.0.2")); !st.Routed {
		t.Fatalf("the other pod: %+v, want routed", st)
	}
	// Routed again (a slice lists it ready once more), then its slice goes.
	w.Update(slice("public", nil, ep{ip: "10.0.0.1", node: node}), node) // Ready nil: unknown, taken as ready
	if st := w.Of("ns", pod); !st.Routed {
		t.Fatalf("listed with no Ready condition: %+v, want routed", st)
	}
	clk.SetTime(time.Unix(1005, 0))
	w.Delete("ns", "public")
	if st := w.Of("ns", pod); st.Routed || !st.Since.Equal(time.Unix(1005, 0)) {
		t.Fatalf("its slice deleted: %+v, want not routed since 1005", st)
	}
}

// What no proxy would send new connections by does not hold a pod.
func TestNotRoutes(t *testing.T) {
	for name, s := range map[string]*discoveryv1.EndpointSlice{
		"not ready":                      slice("s", nil, ep{ip: "10.0.0.1", node: node, ready: no}),
		"another node's endpoint":        slice("s", nil, ep{ip: "10.0.0.1", node: "node-b", ready: yes}),
		"a headless Service's slice":     slice("s", map[string]string{labelHeadless: ""}, ep{ip: "10.0.0.1", node: node, ready: yes}),
		"ready though terminating":       slice("s", nil, ep{ip: "10.0.0.1", node: node, ready: yes, terminating: yes}),
		"terminating, readiness unknown": slice("s", nil, ep{ip: "10.0.0.1", node: node, terminating: yes}),
	} {
		t.Run(name, func(t *testing.T) {
			w := New(nil)
			w.Update(s, node)
			if st := w.Of("ns", pod); st.Routed {
				t.Errorf("%+v, want not routed", st)
			}
		})
	}
	w := New(nil)
	w.Update(slice("s", nil, ep{ip: "10.0.0.1", ready: yes}), node) // no nodeName: could be anyone's, so ours
	if st := w.Of("ns", pod); !st.Routed {
		t.Errorf("an endpoint without a node: %+v, want routed", st)
	}
}

// Run fills the Watcher from the API (a fake clientset here: the wiring,
// the trim and the Known flag) and follows changes.
func TestRunFollowsTheAPI(t *testing.T) {
	s := slice("private", nil, ep{ip: "10.0.0.1", node: node, ready: yes}, ep{ip: "10.0.9.9", node: "node-b", ready: yes})
	client := fake.NewClientset(s)
	w := New(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- w.Run(ctx, client, node) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	testenv.Eventually(t, 10*time.Second, "routed after the first list", func() (bool, string) {
		st := w.Of("ns", pod)
		return st.Known && st.Routed, fmt.Sprintf("%+v", st)
	})
	if st := w.Of("ns", netip.MustParseAddr("10.0.9.9")); st.Routed {
		t.Errorf("another node's pod: %+v, want not routed", st)
	}
	s.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: no, Terminating: yes}
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "not routed after the update", func() (bool, string) {
		st := w.Of("ns", pod)
		return !st.Routed && !st.Since.IsZero(), fmt.Sprintf("%+v", st)
	})
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// A slice of another namespace that lists a pod's address (a tenant that
// may write EndpointSlices in its own namespace) does not hold the pod.
func TestOnlyThePodsNamespaceHoldsIt(t *testing.T) {
	w := New(nil)
	other := slice("steal", nil, ep{ip: "10.0.0.1", node: node, ready: yes})
	other.Namespace = "tenant-b"
	w.Update(other, node)
	if st := w.Of("ns", pod); st.Routed {
		t.Errorf("listed by tenant-b's slice only: %+v, want not routed for the pod of ns", st)
	}
	if st := w.Of("tenant-b", pod); !st.Routed {
		t.Errorf("for tenant-b itself: %+v, want routed", st)
	}
}
