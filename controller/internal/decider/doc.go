// Package decider turns a target's observed metric into a desired pod
// count, excess burst capacity and panic state: a pure state machine of
// its inputs and the time it is given (docs/autoscaling.md, "One
// decision").
package decider
