// Package reconciler drives PodAutoscalers: it decides each target's pod
// count from the collector's windows and scales the target through its
// /scale subresource.
package reconciler
