package endpoints

import (
	"net/netip"
	"sort"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

// Reasons a mode was chosen, as they appear in conditions.
const (
	ReasonServing              = "Serving"              // pods ready, enough burst capacity
	ReasonNoBurstCapacity      = "NoBurstCapacity"      // Proxy: excess burst capacity < 0 (always with TBC -1)
	ReasonScaledToZero         = "ScaledToZero"         // Proxy: no pods wanted
	ReasonContainerConcurrency = "ContainerConcurrency" // Proxy: the activators keep each pod within its containerConcurrency
	ReasonProxying             = "Proxying"             // Proxy asked for, reason not given
	ReasonNoReadyPods          = "NoReadyPods"          // forced Proxy: the private service has no ready endpoint
	ReasonNoActivators         = "NoActivatorEndpoints" // forced Serve: no activator to send traffic to (a containerConcurrency target: Proxy with no endpoints)
)

// Endpoint is one pod behind the public Service.
type Endpoint struct {
	// Name is the pod's name (for activators, what the subset hashes).
	Name string
	// IP is the pod's one address (package podaddr): its IPv4 address if
	// it has one, else its IPv6 one.
	IP netip.Addr
	// Addrs are all its addresses (a dual-stack pod has one of each
	// family), from which each family's slice takes its own (AddrOf); nil
	// means IP alone.
	Addrs []netip.Addr
}

// Wanted is the mode the autoscaler's decision asks for (docs/autoscaling.md,
// "Serve or Proxy"): Serve when pods are wanted, their burst capacity is
// covered and they have no containerConcurrency, else Proxy. Example:
// desired 3, EBC -4 (a burst the ready pods could not absorb) => Proxy, so
// the activator buffers and spreads it.
//
// A target with containerConcurrency (CC) > 0 stays in Proxy: only the
// activators keep a pod within its CC (no proxy runs beside the app, as
// Knative's queue-proxy does), so the direct path would let any number of
// requests reach a CC = 1 pod at once.
func Wanted(desiredScale, excessBurstCapacity, containerConcurrency int32) (v1alpha1.Mode, string) {
	switch {
	case desiredScale == 0:
		return v1alpha1.ModeProxy, ReasonScaledToZero
	case containerConcurrency > 0:
		return v1alpha1.ModeProxy, ReasonContainerConcurrency
	case excessBurstCapacity < 0:
		return v1alpha1.ModeProxy, ReasonNoBurstCapacity
	}
	return v1alpha1.ModeServe, ReasonServing
}

// Inputs are what the public endpoints depend on.
type Inputs struct {
	// Want is the mode the decision asks for and WantReason why (Wanted).
	Want       v1alpha1.Mode
	WantReason string
	// Pods are the target's ready pods (the private Service's endpoints).
	Pods []Endpoint
	// Activators are the ready activator pods; NumActivators how many of
	// them this target should use.
	Activators    []Endpoint
	NumActivators int32
	// Target names the target for the activator subset ("namespace/name").
	Target string
}

// Result is the public Service's endpoints and why.
type Result struct {
	Mode      v1alpha1.Mode
	Reason    string
	Endpoints []Endpoint
}

// Public decides the mode in force and the public endpoints: the wanted
// mode, except that with no ready pod Proxy is forced (the activator holds
// requests while pods start), and with no activator Serve is forced (better
// the pods, or nothing, than a dead end) unless the target is in Proxy for
// its containerConcurrency: the limit is what its app relies on (a model
// that fits once in memory, code that is not thread-safe), and only the
// activators keep it, so such a target stays in Proxy with no endpoint
// until an activator is ready, as its requests would fail in Knative
// with the activators gone and the pods in Proxy. In Proxy mode the
// endpoints are a stable per-target subset of the activators.
func Public(in Inputs) Result {
	mode, reason := in.Want, in.WantReason
	if reason == "" {
		reason = ReasonServing
		if mode == v1alpha1.ModeProxy {
			reason = ReasonProxying
		}
	}
	if len(in.Pods) == 0 {
		mode, reason = v1alpha1.ModeProxy, ReasonNoReadyPods
	}
	if mode == v1alpha1.ModeProxy && len(in.Activators) == 0 {
		if reason == ReasonContainerConcurrency {
			return Result{Mode: v1alpha1.ModeProxy, Reason: ReasonNoActivators}
		}
		mode, reason = v1alpha1.ModeServe, ReasonNoActivators
	}
	if mode == v1alpha1.ModeServe {
		return Result{Mode: mode, Reason: reason, Endpoints: sorted(in.Pods)}
	}
	byName := make(map[string]Endpoint, len(in.Activators))
	names := make([]string, 0, len(in.Activators))
	for _, a := range in.Activators {
		byName[a.Name] = a
		names = append(names, a.Name)
	}
	var eps []Endpoint
	for _, n := range Subset(in.Target, names, int(max(1, in.NumActivators))) {
		eps = append(eps, byName[n])
	}
	return Result{Mode: mode, Reason: reason, Endpoints: sorted(eps)}
}

func sorted(eps []Endpoint) []Endpoint {
	out := append([]Endpoint(nil), eps...)
	sort.Slice(out, func(i, j int) bool { return out[i].IP.Less(out[j].IP) })
	return out
}
