// Package activatorprobe proves that requests to a target's public Service
// reach an activator: a probe request that only an activator answers in kind.
package activatorprobe
