// Package endpointwatch tells whether a Service still sends new
// connections to one of the node's pod addresses: whether some
// EndpointSlice lists it as a ready endpoint, which kube-proxy and the
// dataplanes that follow EndpointSlices choose from, and since when none
// does.
package endpointwatch
