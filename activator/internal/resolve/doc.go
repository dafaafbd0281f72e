// Package resolve finds which target a request is for, from the
// Sockscale-Target header or the host it names.
package resolve
