// Package cachetrim keeps of the Services, EndpointSlices, Ingresses,
// Pods, Namespaces and NetworkPolicies the activator must watch
// cluster-wide only the fields it reads, so that its memory follows its
// targets rather than everything else in the cluster.
package cachetrim
