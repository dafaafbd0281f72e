// Package route reconciles Routes: it resolves each traffic target to a
// Revision, gives the Route and each tag a Kubernetes Service of their
// own, and writes the split in effect into status, where the agents read
// it for the kernel's per-connection split.
package route
