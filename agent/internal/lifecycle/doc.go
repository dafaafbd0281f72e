// Package lifecycle tells, when the agent stops, a restart or rolling
// update (keep the pinned programs and counts) from an uninstall (remove
// everything the agent put in the kernel).
package lifecycle
