// Package integration tests the binaries against a real kube-apiserver and
// etcd (built from pinned modules, see mk/tools.mk) and the real kernel.
package integration
