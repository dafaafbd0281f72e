// Package sampler reads the kernel counters every report period and turns
// them into per-pod samples: the latest counters for metrics, and the
// averages over the period for the controller.
package sampler
