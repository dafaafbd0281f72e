// Package e2e runs KPA.md's scenarios on the local cluster with the chart
// installed by helm (tests named TestE2E*, root, `make test-e2e`).
package e2e
