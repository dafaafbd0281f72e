// Package drain lets a leaving pod finish its requests before its app is
// told to stop: it moves the pod's HTTP/1.x clients off their kept-alive
// connections and tells the pod's preStop hook when nothing is in flight.
package drain
