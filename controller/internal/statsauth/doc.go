// Package statsauth decides who may POST stats batches to the controller:
// it authenticates a bearer token with a TokenReview and authorizes its
// ServiceAccount with SubjectAccessReviews on virtual resources, and
// caches both answers.
//
// # Why ServiceAccount tokens and not mutual TLS
//
// Agents and activators send a projected ServiceAccount token with an
// audience of their own (sockscale-controller by default), so a token
// stolen from a stats request is useless against the API server, and an
// API server token is refused here. Compared with client certificates:
//
//   - nothing to distribute or rotate: the kubelet issues the token, bound
//     to the pod, and renews it before it expires (an hour here); the
//     controller needs no CA of its own to sign clients with;
//   - the node comes in the token: a pod-bound token's TokenReview carries
//     the node the pod runs on (user.extra
//     "authentication.kubernetes.io/node-name", Kubernetes >= 1.30), so an
//     agent cannot claim another node's pods, with no per-node
//     certificate;
//   - RBAC decides who may report: the controller asks whether the caller
//     may "create" nodestats (agents) or targetstats (activators) in the
//     API group sockscale.dev; the chart's ClusterRoles grant exactly that,
//     and a cluster admin sees and audits it like any other permission;
//   - a deleted pod's token stops working at once (the TokenReview checks
//     the pod still exists), where a certificate lives until it expires.
//
// The cost is one TokenReview and two SubjectAccessReviews per token and
// cache lifetime (see Authenticator), not per request.
package statsauth
