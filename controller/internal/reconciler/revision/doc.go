// Package revision reconciles serving Revisions: each gets a Deployment, a
// public Service without a selector and a PodAutoscaler, all controlled by
// it, and a status read from the PodAutoscaler and its ServerlessService.
package revision
