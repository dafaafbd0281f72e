package statsserver

import (
	"bytes"
	"fmt"
	"io"
	"net/http"

	"github.com/sockscale/sockscale/internal/stats"
)

// NodeStateUnreadable marks a node whose state header could not be read
// (an agent newer than this controller, or a broken one).
const NodeStateUnreadable stats.RedirectState = "unreadable"

// Handler decodes batches POSTed to it and hands each to accept. Bad
// batches get 400 with the reason; accept's error gets 503. A node state
// header (stats.HeaderNodeState) it cannot read does not cost the batch
// its counts: the batch is accepted with a NodeState whose SocketRedirect
// is NodeStateUnreadable and whose Reason is the parse error, so the
// ServerlessServices name the node and why.
func Handler(accept func(*stats.Batch) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "stats: only POST is allowed", http.StatusMethodNotAllowed)
			return
		}
		var buf bytes.Buffer
		n, err := io.Copy(&buf, io.LimitReader(r.Body, stats.MaxBatchBytes+1))
		if err != nil {
			http.Error(w, "stats: read body: "+err.Error(), http.StatusBadRequest)
			return
		}
		if n > stats.MaxBatchBytes {
			http.Error(w, fmt.Sprintf("stats: batch larger than %d bytes", stats.MaxBatchBytes), http.StatusRequestEntityTooLarge)
			return
		}
		b, err := stats.Decode(buf.Bytes())
		if err != nil {
			http.Error(w, "stats: "+err.Error(), http.StatusBadRequest)
			return
		}
		if h := r.Header.Get(stats.HeaderNodeState); h != "" {
			ns, err := stats.ParseNodeState(h)
			if err != nil {
				ns = stats.NodeState{SocketRedirect: NodeStateUnreadable, Reason: err.Error()}
			}
			b.NodeState = &ns
		}
		if err := accept(b); err != nil {
			http.Error(w, "stats: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}
