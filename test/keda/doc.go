// Package keda runs KEDA's operator on the local cluster for the
// end-to-end tests, as a user installs it: the version this module's
// go.mod pins, built from its source into an image in the cluster's
// registry, with KEDA's own CRDs and RBAC from that source, in namespace
// keda.
package keda
