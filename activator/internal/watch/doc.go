// Package watch keeps the activator's targets equal to the cluster's
// PodAutoscalers, public Services, ServerlessServices, private
// EndpointSlices, the Ingresses and HTTPRoutes that name them, and the
// serving API's Routes with their Services.
package watch
