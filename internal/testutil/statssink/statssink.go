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
// accept: 204 on success, 400 naming what is wrong otherwise.
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
		accept(b)
		w.WriteHeader(http.StatusNoContent)
	})
}
