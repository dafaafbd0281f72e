// Package recentload keeps every pod's and every target's recent load, as
// agents and activators report it, for the metrics APIs to serve.
package recentload
