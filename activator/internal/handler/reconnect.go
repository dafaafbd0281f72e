package handler

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sockscale/sockscale/activator/internal/target"
	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

// Kept-alive clients and the direct path.
//
// A client's connection goes where its connect went: kube-proxy's
// conntrack keeps an established connection on the endpoint it was sent
// to, and the agents' kernel redirect acts only at connect(). A client
// that connected while its target was in Proxy mode (at zero, or in a
// burst) therefore stays on an activator for as long as it keeps its
// connection open, however long the target has been in Serve mode since.
// So, once the target is served directly, the activator answers such a
// client's next request as usual (forwarded to a pod) and adds
// "Connection: close" to the pod's response: Go's server closes an
// HTTP/1.x connection after writing it, and the client's next connect
// goes to the public Service (from a Route's address, through the
// kernel's split), whose endpoints are the pods now. On an HTTP/2 (h2c)
// connection Go's server takes the same header as a graceful shutdown of
// the connection: GOAWAY naming the last stream it took, those streams
// finished, then closed; a stream the client opens as the GOAWAY is on
// its way is refused unprocessed, which gRPC and Go's transport retry on
// a new connection. Connections that stay idle are moved by Conns
// (conns.go).
//
// What is left alone:
//   - Upgrades (websockets): the connection becomes the upgraded
//     protocol's, and its 101 answer has no next request.
//   - Requests whose client already closes (HTTP/1.0 without keep-alive,
//     "Connection: close"): nothing to ask, nothing counted.
//   - The activator's own answers (503, 504, 502, ...): only a pod's
//     response asks to reconnect; a shutting-down activator asks in any
//     case (shuttingDown).
//   - Targets not in Serve mode, or in it for less than ReconnectAfter:
//     the public endpoints have just changed and every node's kube-proxy
//     and agent may not have caught up (kube-proxy programs at most once
//     a second by default), so a client asked too soon could connect to
//     an activator again; and a target that goes back to Proxy within
//     that time keeps its clients where they are. Each switch to Serve
//     starts the wait again.
//   - The route port: a Route's addresses always lead to the activators
//     (they split per request), so its clients would only reconnect to
//     one (the wiring gives that port's handler no Modes).
//
// A connection is asked once, since it is then closed. No rate bound: a
// client asked to reconnect makes one new connection, to a pod, which is
// what it would have done had it connected in Serve mode; and a client
// that comes back to an activator anyway (a node whose kube-proxy lags
// behind by more than ReconnectAfter) costs the activator a connect per
// request, as any client without keep-alive does.

// Modes tells since when a target has been in Serve mode
// (resolve.Table).
type Modes interface {
	// ServeSince says since when target k has been in Serve mode without
	// a break; false while it is not in Serve mode.
	ServeSince(k target.Key) (time.Time, bool)
}

// DefaultReconnectAfter is how long a target must have been in Serve
// mode before its kept-alive clients are asked to reconnect: twice
// kube-proxy's default minimum sync period, so the new endpoints are in
// place on every node that keeps up.
const DefaultReconnectAfter = 2 * time.Second

// reconnectable says whether the client of r may be asked to reconnect
// after the response to r: a connection that the client keeps open,
// carrying no upgrade.
func reconnectable(r *http.Request) bool {
	return !r.Close && !upgrading(r.Header)
}

// upgrading says whether the request asks to switch protocols
// (websockets), as httputil.ReverseProxy reads it (Connection naming
// Upgrade), or carries an Upgrade header at all.
func upgrading(h http.Header) bool {
	if len(h["Upgrade"]) > 0 {
		return true
	}
	for _, v := range h["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return true
			}
		}
	}
	return false
}

// modifyResponse is the reverse proxies' ModifyResponse, for a pod's
// response: it says whether the request was held through a cold start,
// and asks the client to reconnect (askReconnect).
func (h *handler) modifyResponse(res *http.Response) error {
	if res.Request == nil {
		return nil
	}
	f, ok := res.Request.Context().Value(forwardKey{}).(*forward)
	if !ok {
		return nil
	}
	if f.target.ColdStartHeader && f.slot.ColdStart {
		res.Header.Set(v1alpha1.ColdStartHeader, strconv.FormatFloat(f.slot.Waited.Seconds(), 'f', 3, 64))
	}
	h.askReconnect(res, f)
	return nil
}

// askReconnect gives a pod's response to a request whose connection may
// be asked to reconnect, for a target in Serve mode for ReconnectAfter at
// least, "Connection: close" (httputil.ReverseProxy has already removed
// the pod's hop-by-hop headers, and copies this one to the client's
// response, where Go's server honours it).
func (h *handler) askReconnect(res *http.Response, f *forward) {
	if h.modes == nil || !f.reconnect || res.StatusCode == http.StatusSwitchingProtocols {
		return
	}
	since, serving := h.modes.ServeSince(f.target.Key)
	if !serving || time.Since(since) < h.reconnectAfter {
		return
	}
	res.Header.Set("Connection", "close")
	h.m.reconnects.WithLabelValues(f.target.Key.Namespace).Inc()
}
