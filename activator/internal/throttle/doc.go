// Package throttle holds each target's requests in a bounded queue until
// one of its pods has a free slot, and never gives a pod more requests at
// once than its containerConcurrency allows.
package throttle
