// Package statssink stands in for a controller replica's stats endpoint in
// tests of the components that send stats (agents, activators), which may
// not import the controller's server.
package statssink

import (
	"io"
	"net/http"

	"github.com/sockscale/sockscale/internal/stats"
)

// Handler decodes each POSTed batch as the controller does and hands it to
// accept: 204 on success, 400 naming what is wrong otherwise. A node state
// header (stats.HeaderNodeState) is parsed into the batch's NodeState; one
// that does not parse is a 400 here, so a test of its sender fails (the
// controller accepts the counts and marks the node instead).
func Handler(accept func(*stats.Batch)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, stats.MaxBatchBytes))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		b, err := stats.Decode(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if h := r.Header.Get(stats.HeaderNodeState); h != "" {
			ns, err := stats.ParseNodeState(h)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			b.NodeState = &ns
		}
		accept(b)
		w.WriteHeader(http.StatusNoContent)
	})
}
