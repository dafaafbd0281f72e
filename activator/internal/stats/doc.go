// Package stats measures the requests an activator holds and forwards per
// target, as average concurrency per period, for the controller's windows.
package stats
