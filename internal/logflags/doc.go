// Package logflags parses the --log-level flag that the agent and the
// activator share.
package logflags
