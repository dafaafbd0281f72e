// Package socktable reads the TCP socket table of pods' network namespaces from the kernel over netlink (sock_diag).
//
// The agent's BPF programs count each pod's open server connections from
// the events they see; the kernel's socket table is the ground truth they
// can be checked against. FindNamespaces tells which network namespace
// holds each pod address, Dump lists the TCP sockets of one namespace
// (with the BPF socket storage the agent's programs attached to them), and
// ServerConns keeps the connections a server in the pod accepted and has
// not closed.
package socktable
