// Package securemetrics turns the controller's metrics flags into
// controller-runtime's metrics server options, with the shared
// authentication and authorization filter of internal/securemetrics.
package securemetrics
