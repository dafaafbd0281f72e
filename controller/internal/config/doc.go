// Package config parses the autoscaler's cluster defaults (a ConfigMap) and
// per-target settings into validated, typed values.
//
// Precedence for one target, highest first: the PodAutoscaler's spec, then
// the autoscaling.knative.dev/<key> annotations on the target's pod
// template, then the cluster ConfigMap, then the built-in defaults of
// Defaults. Every value is validated where it is read, and the merged
// settings are validated again for rules across keys (min-scale <=
// max-scale, the target's min-scale <= activation-scale <= max-scale,
// max-scale <= max-scale-limit).
//
// Where a choice had to be made, the reading is Knative's (docs/autoscaling.md,
// "Target value" and "Cluster ConfigMap"): the ConfigMap's
// container-concurrency-target-percentage is the utilization of the
// concurrency metric only, and rps aims at a fixed 70 % of its target
// unless the target sets target-utilization-percentage; unknown ConfigMap
// keys are ignored (the caller warns) rather than refused.
package config
