// Package loadgen drives closed-loop HTTP load for tests and benchmarks and
// keeps the client's own view of it (counts, latencies, in-flight spans).
package loadgen
