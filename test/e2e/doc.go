// Package e2e runs sockscale's end-to-end scenarios (for autoscaling, see
// docs/autoscaling.md, "Scenarios the tests replay") on the local cluster
// with the chart installed by helm (tests named TestE2E*, root, `make test-e2e`).
package e2e
