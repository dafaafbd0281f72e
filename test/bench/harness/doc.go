// Package harness is what the bench commands (test/bench and
// test/bench/scale) share: a real etcd and kube-apiserver, builds of this
// module's commands, a process's CPU and memory, Prometheus metrics,
// percentiles and cleanup on interrupt.
package harness
