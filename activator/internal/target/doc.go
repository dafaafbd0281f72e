// Package target names the targets an activator serves and holds what it
// must know of each to route and hold its requests.
package target
