// Command sockscale-demo shows sockscale at work on the local cluster: a load
// ramp against the autoscale test app, a live table and a PNG timeline.
package main
