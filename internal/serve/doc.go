// Package serve runs the small HTTP endpoints (metrics, health, stats) with
// bounded headers and timeouts until their context ends, then shuts them
// down gracefully.
package serve
