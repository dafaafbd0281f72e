// Command coldstart-node measures a cold start end to end on the local
// cluster, on a simulated node and on a real one side by side: one
// request to a target at zero (no pod, its public Service on the
// activators) until its 200, 30 times per node. The target is the
// autoscale test app (a static Go HTTP server, its image already on the
// node after the first pod) pinned to node-a (the cluster's simulated
// kubelet) or to real-a (a real kubelet, containerd and runc).
//
// Each sample has its steps as watches saw them (the Deployment scaled,
// the pod created, scheduled, its sandbox ready, its IP, its container
// running, its address in the private Service's EndpointSlices, Ready)
// and the activator's share: the app's X-Listening-For on the first
// answer, the time from the new pod's listener opening to the held
// request reaching it. The table gives, per node, p50/p95/max end to end,
// the share's p50/p95 (also from the later of the listener and the
// endpoint), each step's p50 offset from the request, and the two longest
// stretches between them. docs/benchmarks.md ("Cold start on a simulated
// and a real node") has the method and the latest run.
//
//	go run ./test/bench/coldstart-node [-samples 30] [-timeout 60s]
//	    [-stable-window 6s] [-grace 1s] [-state-dir DIR]
//
// It needs root, the pinned cluster binaries and the real node's (make
// cluster-binaries real-node-binaries) and $HELM; `make bench` runs it.
// Only one local cluster runs per machine: Up waits for another to go
// down (up to -up-timeout). The cluster is taken down on every exit. Any
// sample that is not answered 200 makes the command exit 1, after the
// table.
package main
