// Package testpod runs processes as fake pods: each in its own network
// namespace with a veth to the host and in its own cgroup, for real-kernel
// tests and benchmarks on one machine.
package testpod
