// Package report sends each period's stats batch to every controller
// replica (see package stats for the protocol).
package report
