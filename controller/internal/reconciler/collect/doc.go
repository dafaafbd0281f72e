// Package collect keeps the collector's view of every PodAutoscaler
// current on every controller replica, leader or not: the settings its
// windows need and the ready pods its stats should come from.
package collect
