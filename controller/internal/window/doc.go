// Package window keeps time-bucketed averages of per-second samples: the
// stable and panic windows of the autoscaler, one ring serving both.
package window
