// Package podaddr says which of a pod's addresses names it where one must:
// the same choice in the agent, the stats it sends and the controller.
package podaddr
