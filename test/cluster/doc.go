// Package cluster runs a real Kubernetes control plane and simulated nodes,
// whose pods are processes in their own network namespace and cgroup, on one
// machine with no container runtime.
package cluster
