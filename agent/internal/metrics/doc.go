// Package metrics exports the node's per-pod request accounting and the
// agent's own health in Prometheus format.
package metrics
