// Package kpa reconciles PodAutoscalers: it decides each target's pod
// count from the collector's windows, scales the target through its
// /scale subresource and writes the ServerlessService's wanted mode.
package kpa
