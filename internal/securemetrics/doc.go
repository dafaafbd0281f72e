// Package securemetrics serves /metrics over TLS to callers the API server
// authenticates (TokenReview) and authorizes (SubjectAccessReview for a get
// of the /metrics non-resource URL), for the controller, the agent and the
// activator.
package securemetrics
