// Package sks reconciles ServerlessServices: the private Service that
// selects a target's pods and the public Service's EndpointSlices (the
// pods in Serve mode, a subset of the activators in Proxy mode).
package sks
