// Package readiness tells the throttle which of a target's pods are ready,
// probing new pods directly so traffic flows the moment one answers.
package readiness
