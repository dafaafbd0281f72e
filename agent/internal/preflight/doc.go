// Package preflight checks, before the agent loads anything, that the node
// can run it, and says exactly what is missing when it cannot.
package preflight
