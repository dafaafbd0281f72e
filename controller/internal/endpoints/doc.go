// Package endpoints decides a target's mode (Serve or Proxy) and what its
// public Service's endpoints are in that mode, down to the stable subset
// of activators it uses.
package endpoints
