// Package bucket splits the targets among controller replicas: one Lease
// per bucket, a target's bucket fixed by a hash of its name.
package bucket
