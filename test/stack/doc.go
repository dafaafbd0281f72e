// Package stack installs sockscale with its Helm chart and deploys the
// autoscale test app on a cluster: what the end-to-end tests and the demo
// share.
package stack
