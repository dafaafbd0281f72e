// Command scale measures sockscale's control plane at scale: the real
// sockscale-controller against a real kube-apiserver and etcd with N
// PodAutoscalers and a simulated fleet of N/2 nodes' agents (100 pods
// each, 50 per target) and 3 activators posting real, authenticated stats
// batches; docs/scale-bench.md says what each number measures.
//
//	go run ./test/bench/scale [-targets 1000,3000,10000] [-cold 50] [-warmup 20s] [-duration 60s]
//	    [-steady-timeout 10m] [-controller PATH] [-profile DIR]
//	    [-replicas 1,2] [-buckets 0] [-others 0]
//
// It needs the pinned etcd and kube-apiserver in $KUBEBUILDER_ASSETS
// (`make bench` builds them and runs it), and no privilege: everything
// it starts listens on loopback addresses.
package main
