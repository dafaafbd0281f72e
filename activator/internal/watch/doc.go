// Package watch keeps the activator's targets equal to the cluster's
// PodAutoscalers, public Services, ServerlessServices, private
// EndpointSlices, and the Ingresses and HTTPRoutes that name them.
package watch
