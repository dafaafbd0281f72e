// Package workload makes objects as a cluster's other workloads have
// them, for tests and benchmarks of what sockscale caches of them.
package workload
