package stats

import (
	"fmt"
	"net/url"
	"unicode/utf8"
)

// HeaderNodeState is the HTTP header in which an agent says, beside its
// batch, how the socket layer stands on its node. It is a header rather
// than part of the encoding so that a controller that predates it ignores
// it, and batches stay readable both ways during a rolling upgrade.
//
// The value is URL-query encoded, e.g.
//
//	socket-redirect=syncing&reason=watch+ServerlessServices%3A+forbidden
//
// Keys other than those below are ignored, so later agents may add some.
const HeaderNodeState = "Sockscale-Node-State"

// RedirectState is how the connect-time redirect stands on a node.
type RedirectState string

const (
	// RedirectActive means the node's map follows the ServerlessServices, so
	// a switch to Proxy reaches new connects from the node in milliseconds.
	RedirectActive RedirectState = "active"
	// RedirectSyncing means the redirect is loaded but its map may lag (the
	// agent is starting, or its watch of the API server fails).
	RedirectSyncing RedirectState = "syncing"
	// RedirectOff means the agent runs with --socket-redirect=off (or without
	// an activator selector): only the EndpointSlices switch the node.
	RedirectOff RedirectState = "off"
	// RedirectUnavailable means --socket-redirect=auto could not run it (the
	// kernel cannot load it, or the API objects it watches are missing or
	// forbidden); only the EndpointSlices switch the node.
	RedirectUnavailable RedirectState = "unavailable"
)

// MaxNodeStateReason bounds the reason an agent sends, in bytes.
const MaxNodeStateReason = 256

// NodeState is an agent's state beside its batch.
type NodeState struct {
	SocketRedirect RedirectState
	// Reason says in words why the state is not active (empty when it is).
	Reason string
}

// Encode returns the header value. A reason longer than
// MaxNodeStateReason is cut (at a character boundary) and ends in "...".
func (s NodeState) Encode() string {
	v := url.Values{"socket-redirect": {string(s.SocketRedirect)}}
	if s.Reason != "" {
		v.Set("reason", truncate(s.Reason, MaxNodeStateReason))
	}
	return v.Encode()
}

// ParseNodeState reads a header value written by Encode. A value this
// version does not know is an error that names it, not a guess.
func ParseNodeState(header string) (NodeState, error) {
	v, err := url.ParseQuery(header)
	if err != nil {
		return NodeState{}, fmt.Errorf("%s %q: %w", HeaderNodeState, truncate(header, 64), err)
	}
	s := NodeState{SocketRedirect: RedirectState(v.Get("socket-redirect")), Reason: v.Get("reason")}
	switch s.SocketRedirect {
	case RedirectActive, RedirectSyncing, RedirectOff, RedirectUnavailable:
	default:
		return NodeState{}, fmt.Errorf("%s: socket-redirect=%q: want active, syncing, off or unavailable", HeaderNodeState, truncate(string(s.SocketRedirect), 64))
	}
	if len(s.Reason) > MaxNodeStateReason+len("...") {
		return NodeState{}, fmt.Errorf("%s: reason of %d bytes: at most %d allowed", HeaderNodeState, len(s.Reason), MaxNodeStateReason)
	}
	return s, nil
}

// truncate cuts s to at most n bytes without splitting a UTF-8 character,
// marking the cut with "...".
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n-- // s[n] continues a character that starts before the cut
	}
	return s[:n] + "..."
}
