// Package release hands every public Service that sockscale managed back
// to Kubernetes when sockscale is uninstalled, so that no EndpointSlice
// sockscale wrote is left pointing at pods it no longer follows or at
// activators that are gone.
package release
