// Package v1alpha1 is the sockscale.dev/v1alpha1 API: PodAutoscaler, which
// users write, and ServerlessService, which the controller makes.
//
// +kubebuilder:object:generate=true
// +groupName=sockscale.dev
package v1alpha1
