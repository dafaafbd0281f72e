// Package podindex keeps every pod's name, labels, node and address, so the
// metrics APIs can check the agents' records against the pods they claim.
package podindex
