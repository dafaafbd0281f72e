// Package lifecycle tests the chart's upgrade and uninstall on the local
// cluster: it has a cluster of its own, since its last step removes the
// release that test/e2e shares between its tests.
package lifecycle
