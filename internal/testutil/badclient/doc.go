// Package badclient sends malformed, oversized and slow requests to a real
// server for tests of its limits.
package badclient
