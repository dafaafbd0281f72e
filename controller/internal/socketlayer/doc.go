// Package socketlayer tells, for each ServerlessService, whether the
// kernel's connect-time redirect switches it on every node: the SocketLayer
// condition that `kubectl get sks` shows.
//
// Two layers switch a target between its pods (Serve) and the activators
// (Proxy). The public Service's EndpointSlices, written by the controller,
// reach every client through kube-proxy (or the cluster's dataplane), in
// seconds. The connect-time redirect, kept by each node's agent, reaches
// the sockets opened on that node within milliseconds, but only where an
// agent runs it. The condition says whether the fast layer is in effect
// everywhere an agent reports from, and names the nodes where it is not.
//
// Agents send their node's state beside their stats every report period
// (stats.HeaderNodeState); the Tracker keeps the latest per node, and
// Notifier wakes the ServerlessService reconciler when the summary changes.
// Nodes are known only by their agents' reports: a node whose agent never
// reported is not counted, and one that fell silent is forgotten after
// ForgetAfter (a node removed from the cluster stops reporting too).
package socketlayer
