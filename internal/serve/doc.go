// Package serve runs an HTTP server until its context ends, then shuts it
// down gracefully.
package serve
