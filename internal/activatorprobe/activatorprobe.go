package activatorprobe

import "net/http"

// The probe protocol. The controller sends GET / with Header: Value and a
// User-Agent starting with "sockscale-probe/" (so the agents do not count
// it as load); an activator answers 200 with ResponseHeader set to its pod
// name without forwarding the request. Anything else (a pod's own answer,
// a refused connection) means the activator is not in the path yet.
const (
	Header         = "Sockscale-Probe"
	Value          = "activator"
	ResponseHeader = "Sockscale-Activator"
	UserAgent      = "sockscale-probe/activator"
)

// IsProbe says whether r is an activator probe.
func IsProbe(r *http.Request) bool { return r.Header.Get(Header) == Value }
