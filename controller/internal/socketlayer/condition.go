package socketlayer

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockscale/sockscale/internal/stats"
	"github.com/sockscale/sockscale/internal/svcaddr"
)

// ConditionType is the ServerlessService condition this package computes.
const ConditionType = "SocketLayer"

// Reasons of the SocketLayer condition.
const (
	// ReasonInEffect (True): every reporting node redirects the target's
	// new connects in the kernel.
	ReasonInEffect = "InEffect"
	// ReasonNotOnEveryNode (False): some nodes run no redirect (off by
	// flag, unavailable, or a state this controller cannot read).
	ReasonNotOnEveryNode = "NotOnEveryNode"
	// ReasonNodesNotInSync (Unknown): some nodes' maps may lag (their
	// agents are starting, failing to watch, or silent).
	ReasonNodesNotInSync = "NodesNotInSync"
	// ReasonNoAgentReports (Unknown): no agent reports its node's state.
	ReasonNoAgentReports = "NoAgentReports"
	// ReasonNotRedirectable (False): the public Service has no address
	// the kernel matches (headless, no TCP port, missing).
	ReasonNotRedirectable = "NotRedirectable"
	// ReasonNoActivatorOfFamily (False): the public Service has a family
	// (IPv4, IPv6) that no ready activator has an address of; the
	// ServerlessService reconciler sets it.
	ReasonNoActivatorOfFamily = "NoActivatorOfFamily"
)

// listedNodes bounds the nodes a message names, so a cluster-wide problem
// makes a short message, not a status of thousands of names.
const listedNodes = 3

// Condition is the SocketLayer condition of a ServerlessService whose
// public Service is svc (nil when it does not exist) with the given port
// (spec.port), under the nodes' states s. ok is false when it should be
// left as it is: this controller started too recently to have heard from
// the agents (they report every second), so it knows nothing yet.
func Condition(s Summary, svc *corev1.Service, port int32) (st metav1.ConditionStatus, reason, msg string, ok bool) {
	if _, why := svcaddr.Redirected(svc, port); why != "" {
		return metav1.ConditionFalse, ReasonNotRedirectable,
			svcaddr.Explain(why) + "; Proxy mode reaches its clients through the EndpointSlices (kube-proxy) only", true
	}
	if !s.Reporting() {
		if !s.Warm {
			return "", "", "", false
		}
		return metav1.ConditionUnknown, ReasonNoAgentReports,
			"no agent reports its node's state (none runs, or they predate this controller)", true
	}
	var off, lagging []NodeState
	for _, n := range s.Others {
		switch n.State {
		case stats.RedirectSyncing, Silent:
			lagging = append(lagging, n)
		default:
			off = append(off, n)
		}
	}
	const slow = "new connects from there reach the activators through the EndpointSlices (kube-proxy), seconds after a switch"
	switch {
	case len(off) > 0:
		return metav1.ConditionFalse, ReasonNotOnEveryNode,
			fmt.Sprintf("no redirect on %s; %s", describe(off), slow), true
	case len(lagging) > 0:
		return metav1.ConditionUnknown, ReasonNodesNotInSync,
			fmt.Sprintf("the redirect map may lag on %s; %s", describe(lagging), slow), true
	}
	return metav1.ConditionTrue, ReasonInEffect,
		"every reporting node's agent redirects new connects to the activators in Proxy mode, in the kernel", true
}

// describe names up to listedNodes nodes with their state and reason:
// "2 nodes: node-c (off: --socket-redirect=off), node-d (syncing: ...)".
func describe(nodes []NodeState) string {
	var b strings.Builder
	if len(nodes) == 1 {
		b.WriteString("1 node: ")
	} else {
		fmt.Fprintf(&b, "%d nodes: ", len(nodes))
	}
	for i, n := range nodes {
		if i == listedNodes {
			fmt.Fprintf(&b, " and %d more", len(nodes)-listedNodes)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(n.Node + " (" + string(n.State))
		if n.Reason != "" {
			b.WriteString(": " + n.Reason)
		}
		b.WriteString(")")
	}
	return b.String()
}
