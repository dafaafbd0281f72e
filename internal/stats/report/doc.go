// Package report sends stats batches to every controller replica (see
// package stats for the protocol); agents and activators both use it.
package report
