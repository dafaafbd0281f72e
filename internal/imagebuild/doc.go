// Package imagebuild builds the project's OCI images from Go packages on a
// locally made minimal base, reproducibly (same inputs, same digest), and
// writes them to an OCI layout or pushes them to a registry.
package imagebuild
