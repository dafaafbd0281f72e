// Package handler is the activator's HTTP front: it answers probes,
// refuses what would make it an open proxy, resolves each request's
// target, holds it in the throttle and forwards it to one of the target's
// pods if the client may reach that pod.
package handler
