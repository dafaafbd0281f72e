package endpoints

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

func eps(prefix string, n int) []Endpoint {
	var out []Endpoint
	for i := range n {
		out = append(out, Endpoint{Name: fmt.Sprintf("%s-%d", prefix, i), IP: netip.AddrFrom4([4]byte{10, 1, byte(len(prefix)), byte(i + 1)})})
	}
	return out
}

// in fills the wanted mode from a decision, as the reconcilers do.
func in(desired, ebc int32, i Inputs) Inputs {
	return inCC(desired, ebc, 0, i)
}

// inCC is in for a target with containerConcurrency cc.
func inCC(desired, ebc, cc int32, i Inputs) Inputs {
	i.Want, i.WantReason = Wanted(desired, ebc, cc)
	return i
}

func TestModes(t *testing.T) {
	pods, acts := eps("pod", 3), eps("activator", 4)
	tests := []struct {
		name       string
		in         Inputs
		wantMode   v1alpha1.Mode
		wantReason string
		wantCount  int
	}{
		{"pods wanted and burst covered: Serve", in(3, 5, Inputs{Pods: pods, Activators: acts, NumActivators: 2}), v1alpha1.ModeServe, ReasonServing, 3},
		{"negative excess burst capacity: Proxy", in(3, -1, Inputs{Pods: pods, Activators: acts, NumActivators: 2}), v1alpha1.ModeProxy, ReasonNoBurstCapacity, 2},
		{"scaled to zero: Proxy", in(0, 0, Inputs{Pods: pods, Activators: acts, NumActivators: 2}), v1alpha1.ModeProxy, ReasonScaledToZero, 2},
		{"no ready pod forces Proxy", in(3, 5, Inputs{Activators: acts, NumActivators: 3}), v1alpha1.ModeProxy, ReasonNoReadyPods, 3},
		{"no activator forces Serve", in(3, -1, Inputs{Pods: pods}), v1alpha1.ModeServe, ReasonNoActivators, 3},
		{"containerConcurrency: Proxy, whatever the burst capacity", inCC(3, 5, 1, Inputs{Pods: pods, Activators: acts, NumActivators: 1}), v1alpha1.ModeProxy, ReasonContainerConcurrency, 1},
		{"containerConcurrency at zero: scaled to zero", inCC(0, 5, 3, Inputs{Pods: pods, Activators: acts, NumActivators: 2}), v1alpha1.ModeProxy, ReasonScaledToZero, 2},
		{"containerConcurrency without activators: Proxy, no endpoint (the limit holds)", inCC(3, 5, 1, Inputs{Pods: pods}), v1alpha1.ModeProxy, ReasonNoActivators, 0},
		{"containerConcurrency at zero without activators: nothing either way", inCC(0, 5, 1, Inputs{}), v1alpha1.ModeServe, ReasonNoActivators, 0},
		{"more activators wanted than exist: all of them", in(0, 0, Inputs{Pods: pods, Activators: acts, NumActivators: 9}), v1alpha1.ModeProxy, ReasonScaledToZero, 4},
	}
	for _, tt := range tests {
		got := Public(tt.in)
		if got.Mode != tt.wantMode || got.Reason != tt.wantReason || len(got.Endpoints) != tt.wantCount {
			t.Errorf("%s: %s %s with %d endpoints, want %s %s with %d", tt.name, got.Mode, got.Reason, len(got.Endpoints), tt.wantMode, tt.wantReason, tt.wantCount)
		}
	}
}

func TestProxySubsetIsStablePerTarget(t *testing.T) {
	acts := eps("activator", 6)
	input := in(0, 0, Inputs{Pods: eps("pod", 1), Activators: acts, NumActivators: 2, Target: "ns/hello"})
	first := Public(input)
	// The activator list in another order picks the same subset.
	input.Activators = append([]Endpoint{acts[5], acts[3]}, acts[:3]...)
	input.Activators = append(input.Activators, acts[4])
	if diff := cmp.Diff(first, Public(input), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("subset changed with the list's order (-first +second):\n%s", diff)
	}
}
