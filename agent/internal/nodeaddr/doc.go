// Package nodeaddr follows the node's own IPv4 addresses over netlink, so
// the kernel programs know which clients are the node itself: the kubelet's
// health probes come from one of them.
package nodeaddr
