// Package names holds what the PodAutoscaler and ServerlessService
// reconcilers both name: the private Service, the Ready condition and its
// NotOwned reason.
package names
