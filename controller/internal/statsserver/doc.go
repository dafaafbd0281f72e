// Package statsserver takes the stats batches that agents POST to every
// controller replica (internal/stats is their wire format) and hands each
// to the collector.
package statsserver
