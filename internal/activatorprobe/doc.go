// Package activatorprobe is the probe contract between the controller and
// the activators: a request that only an activator answers in kind, which
// proves that a target's public Service reaches one. The activator's
// handler answers it; the controller's sender is kpa.HTTPProber.
package activatorprobe
