// Package netpol applies a target namespace's NetworkPolicies on behalf of
// its pods to the requests the activator forwards to them, so that a
// client the policies would refuse cannot reach the pods through the
// activator instead.
package netpol
