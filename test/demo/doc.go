// Command sockscale-demo shows sockscale at work on the local cluster: a load
// ramp against the autoscale test app, the idle app scaling to zero, a burst
// of requests waking it through the activators with the first request's
// latency stage by stage, a live table and a PNG timeline; then a serving
// Service's gradual rollout from v1 to v2 under new connections from in-node
// clients, the scheduled split beside the measured one, line by line and in
// a second PNG.
package main
