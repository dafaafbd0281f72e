// Package stack installs sockscale with its Helm chart and deploys the
// autoscale test app on a cluster, and reads what they show (activators'
// and agents' metrics, a serving Route's traffic, an in-node socket's real
// destination): what the end-to-end tests and the demo share.
package stack
