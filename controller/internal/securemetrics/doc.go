// Package securemetrics serves the controller's /metrics over TLS to callers
// the API server authenticates (TokenReview) and authorizes
// (SubjectAccessReview for a get of the /metrics non-resource URL).
package securemetrics
