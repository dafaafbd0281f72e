// Package metricsapi serves the pods' and Deployments' recent load as
// custom.metrics.k8s.io and external.metrics.k8s.io, for the
// HorizontalPodAutoscaler and KEDA.
package metricsapi
