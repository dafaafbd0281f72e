// Package owned builds the ownership chain the controller and Kubernetes
// give a target (PodAutoscaler -> ServerlessService -> private Service ->
// EndpointSlices), for tests that write those objects themselves.
package owned
