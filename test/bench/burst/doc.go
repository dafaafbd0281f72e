// Command burst measures what a target's burst capacity (TBC) costs and buys
// on the local cluster: targets that differ only in their
// targetBurstCapacity (by default 211, Knative's default; 0, the activators
// in the path only at zero; 1, Proxy only while the panic-window load
// exceeds what the ready pods can take) each run, one after the other, a
// steady load of 8 pods' worth, a burst from 1 to 100 requests in flight
// within a second, and 100 clients arriving at the target scaled to zero.
// Each row gives requests/s, p50 and p99, failed requests, the most ready
// pods, the share of requests that went through the activators (their
// forwarded counters for the target against the client's total) and how
// long the target's ServerlessService was in Proxy mode. docs/benchmarks.md
// ("Burst capacity on the local cluster") has the method and the latest run.
//
//	go run ./test/bench/burst [-tbc 211,0,1] [-clients keepalive,newconn]
//	    [-sleep 50ms] [-steady 56] [-burst 100] [-burst-duration 30s]
//	    [-steady-duration 20s] [-zero-duration 15s]
//
// It needs root, the pinned cluster binaries (make cluster-binaries) and
// $HELM; `make bench` runs it. The clients are this process, outside the
// nodes: they reach each public Service through kube-proxy, so a mode switch
// reaches them when kube-proxy has the new endpoints, not through the
// agents' connect-time redirect. The cluster is taken down on every exit.
package main
