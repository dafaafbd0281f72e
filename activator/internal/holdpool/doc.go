// Package holdpool bounds the requests an activator holds across all
// targets and shares that bound fairly (max-min) among namespaces.
package holdpool
