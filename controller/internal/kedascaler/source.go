package kedascaler

import "time"

// Source is where the scaler reads a Deployment's load: the controller's
// stats store. Both methods are called on every KEDA call and on every
// idle check of an open stream (once a second each), so they must be cheap.
type Source interface {
	// Target is the recent load of the Deployment workload in namespace;
	// ok false when nothing was ever heard.
	Target(namespace, workload string) (Load, bool)
	// WhenActive returns a channel closed as soon as the target has
	// requests in flight or held (at once if it has now). Callers may drop
	// the channel unread, so a store should hand out one shared channel
	// per target rather than remember one per call.
	WhenActive(namespace, workload string) <-chan struct{}
	// Exists says whether the Deployment workload is in namespace (from
	// a cache: asked on KEDA's every call). A trigger that names none is
	// an error KEDA shows on its ScaledObject, not a load of 0 that would
	// look like an idle Deployment.
	Exists(namespace, workload string) (bool, error)
}

// Load is a Deployment's load as the store's windows see it.
type Load struct {
	// Concurrency and RPS are averages over the store's window, pods' and
	// activators' together, each request counted once.
	Concurrency, RPS float64
	// ActivatorConcurrency is the part of Concurrency held or forwarded
	// by the activators, averaged over the window.
	ActivatorConcurrency float64
	// LatestConcurrency is the average of the most recent complete
	// second, pods and activators: what is active now.
	LatestConcurrency float64
	// Pods is how many of the Deployment's pods reported in the most
	// recent second. With none, every request in flight is one an
	// activator holds until a pod is ready.
	Pods int
	// Heard is when the store last heard of the Deployment.
	Heard time.Time
}
