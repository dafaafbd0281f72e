// Command sockscale-cluster runs a local Kubernetes cluster whose nodes are
// simulated on this machine (see package test/cluster):
//
//	sockscale-cluster up [--nodes 2] [--real-nodes 0] [--dual-stack] [--state-dir DIR]
//	sockscale-cluster status
//	sockscale-cluster down
//
// `simulate`, `registry` and `pod-init` are its own helpers, started by `up`.
package main
