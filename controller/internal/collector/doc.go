// Package collector turns the agents' and activators' per-period stats
// into per-target stable and panic windows of concurrency and RPS.
package collector
