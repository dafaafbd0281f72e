// Package bpf loads the in-kernel request accounting programs and gives the
// agent typed, consistent snapshots of their per-pod counters.
package bpf
