// Package chart holds the tests of the Helm chart charts/sockscale: they
// render it with the pinned helm ($HELM, built by `make helm`) and check
// the objects it produces (package chart_test).
package chart
