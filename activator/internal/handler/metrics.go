package handler

import "github.com/prometheus/client_golang/prometheus"

// Reasons of the activator's own error answers, the values of the reason
// label.
const (
	reasonConnect         = "connect"
	reasonLoop            = "loop"
	reasonAbsoluteURI     = "absolute_uri"
	reasonBadTargetHeader = "bad_target_header"
	reasonUnknownTarget   = "unknown_target"
	reasonAmbiguousTarget = "ambiguous_target"
	reasonQueueFull       = "queue_full"
	// The activator holds --max-held requests and the request's
	// namespace its fair share (refused), or a held request was shed for
	// a namespace holding less than its share (holdpool).
	reasonMaxHeld        = "max_held"
	reasonShed           = "shed"
	reasonDeadline       = "deadline"
	reasonTargetRemoved  = "target_removed"
	reasonShuttingDown   = "shutting_down"
	reasonPodError       = "pod_error"
	reasonPodUnreachable = "pod_unreachable"
	reasonPodTimeout     = "pod_timeout"
	reasonInternal       = "internal"
	// A Route's host whose status.traffic says nowhere to go, or whose
	// chosen revision is no known target.
	reasonRouteNotReady        = "route_not_ready"
	reasonRouteRevisionUnknown = "route_revision_unknown"
	// The NetworkPolicies of the target's namespace do not admit the
	// client to the chosen pod (403), or cannot be checked yet (503).
	reasonNetworkPolicy          = "network_policy"
	reasonNetworkPolicyUndecided = "network_policy_undecided"
)

// Metrics are the handler's counters.
type Metrics struct {
	responses    *prometheus.CounterVec
	reconnects   *prometheus.CounterVec
	moves        *prometheus.CounterVec
	healthChecks *prometheus.CounterVec
}

// NewMetrics makes the handler's metrics and registers them with reg
// (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		// No target labels: the unresolved requests have none, and a
		// label per host a client invents would be unbounded. Per-target
		// results are the throttle's sockscale_activator_hold_results_total.
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_activator_error_responses_total",
			Help: "Errors the activator answered itself, by code and reason: 405 connect; 508 loop; 400 absolute_uri, bad_target_header; " +
				"403 network_policy (the target namespace's NetworkPolicies do not admit the client); 404 unknown_target, ambiguous_target; 503 queue_full, max_held (the activator holds --max-held requests and the namespace its fair share), shed (a held request dropped for a namespace holding less than its fair share), target_removed, shutting_down, route_not_ready, route_revision_unknown, network_policy_undecided; 504 deadline, pod_timeout; " +
				"502 pod_error, pod_unreachable (several pods in a row could not be reached); 500 internal.",
		}, []string{"code", "reason"}),
		// By the target's namespace only, as the NetworkPolicy denials:
		// namespaces are as many as the cluster has, a label per target
		// would need forgetting when it goes.
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_activator_reconnects_asked_total",
			Help: "Kept-alive connections asked to reconnect (Connection: close on a pod's response; GOAWAY on HTTP/2) because their target had been in Serve mode for --reconnect-served-after: the client's next connect goes to the pods, not an activator. By the target's namespace.",
		}, []string{"namespace"}),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_activator_connections_moved_total",
			Help: "Kept-alive connections moved off the activator between responses because their target had been in Serve mode for --reconnect-served-after: how=closed (an idle HTTP/1.x connection), how=goaway (an HTTP/2 connection, shut down gracefully). By the target's namespace.",
		}, []string{"namespace", "how"}),
		healthChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sockscale_activator_health_checks_answered_total",
			Help: "Health checks (a target's spec.activator.healthChecks) the activator answered itself because the target had no ready pod: not forwarded, not counted as load, not waking it. By the target's namespace.",
		}, []string{"namespace"}),
	}
	if reg != nil {
		reg.MustRegister(m.responses, m.reconnects, m.moves, m.healthChecks)
	}
	return m
}
