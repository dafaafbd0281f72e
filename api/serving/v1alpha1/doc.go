// Package v1alpha1 is the serving.sockscale.dev/v1alpha1 API: Service,
// Revision and Route, Knative Serving's shapes on top of the autoscaler.
//
// +kubebuilder:object:generate=true
// +groupName=serving.sockscale.dev
package v1alpha1
