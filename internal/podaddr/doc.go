// Package podaddr names the one address that identifies a pod wherever
// sockscale needs a single one (the agents' stats records, the
// controller's windows and recent loads, the metrics APIs' check of a
// record against its pod): the pod's IPv4 address if it has one, else its
// first IPv6 address. IPv4-only and dual-stack clusters so keep the keys
// and the wire they had before IPv6; only IPv6-only pods are known by an
// IPv6 address.
package podaddr
