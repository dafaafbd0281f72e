// Package kedascaler serves KEDA's external scaler gRPC contract over mutual
// TLS, so that a ScaledObject's external or external-push trigger scales a
// Deployment of its own namespace on the concurrency or requests per second
// that sockscale measures in the kernel.
package kedascaler
