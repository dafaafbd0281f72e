// Package window keeps time-bucketed averages of per-second samples: a ring
// of one-second buckets, and the linear and weighted-exponential means of
// the stable and panic windows read from it.
package window
