// Package watch keeps the activator's targets equal to the cluster's
// PodAutoscalers, public Services, ServerlessServices and private
// EndpointSlices.
package watch
