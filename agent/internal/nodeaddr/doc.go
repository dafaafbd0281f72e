// Package nodeaddr follows the node's own addresses (IPv4 and IPv6) over
// netlink, so the kernel programs know which clients are the node itself:
// the kubelet's health probes come from one of them.
package nodeaddr
