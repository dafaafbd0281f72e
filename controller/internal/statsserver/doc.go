// Package statsserver takes the stats batches that agents and activators
// POST to every controller replica (internal/stats is their wire format),
// admits only those their senders may send (statsauth says who they are),
// and hands each to the collector.
package statsserver
