package stats

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
)

// FuzzParseNodeState: the Sockscale-Node-State header comes from whoever
// holds an agent's token, or from an older or newer agent.
//
//	| input                     | invariant                                              |
//	|---------------------------|--------------------------------------------------------|
//	| accepted                  | socket-redirect is one of the four states; the reason  |
//	|                           | at most MaxNodeStateReason bytes plus "..."            |
//	| accepted                  | Encode then ParseNodeState gives the same NodeState,   |
//	|                           | its reason cut as Encode documents (a reason of 257 to |
//	|                           | 259 bytes, which Encode's own cut writes, is cut again:|
//	|                           | the cut is not idempotent; nothing re-encodes)         |
//	| rejected                  | zero NodeState; the error names the header and quotes  |
//	|                           | the offending value (cut to 64 bytes) or the length    |
//	| any NodeState we Encode   | parses back, its reason cut as Encode documents        |
func FuzzParseNodeState(f *testing.F) {
	for _, s := range []string{
		"socket-redirect=active",
		"socket-redirect=syncing&reason=watch+ServerlessServices%3A+forbidden",
		"socket-redirect=active&later-key=1",
		"socket-redirect=bogus",
		"reason=x",
		"socket-redirect=off;x",
		"%zz",
		"socket-redirect=unavailable&reason=" + strings.Repeat("%C3%A9", 200),
	} {
		f.Add(s, uint8(0), "")
	}
	f.Add("", uint8(3), "x"+strings.Repeat("é", MaxNodeStateReason))
	states := []RedirectState{RedirectActive, RedirectSyncing, RedirectOff, RedirectUnavailable}
	f.Fuzz(func(t *testing.T, header string, state uint8, reason string) {
		s, err := ParseNodeState(header)
		if err != nil {
			if s != (NodeState{}) {
				t.Errorf("ParseNodeState(%q) = %+v with error %v, want the zero NodeState", header, s, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, HeaderNodeState) {
				t.Errorf("ParseNodeState(%q) error %q does not name %s", header, msg, HeaderNodeState)
			}
			v, perr := url.ParseQuery(header)
			switch {
			case perr != nil:
				if want := fmt.Sprintf("%q", truncate(header, 64)); !strings.Contains(msg, want) {
					t.Errorf("ParseNodeState(%q) error %q does not quote the header %s", header, msg, want)
				}
			case !valid(RedirectState(v.Get("socket-redirect"))):
				if want := fmt.Sprintf("socket-redirect=%q", truncate(v.Get("socket-redirect"), 64)); !strings.Contains(msg, want) {
					t.Errorf("ParseNodeState(%q) error %q does not name the value: want %s", header, msg, want)
				}
			default:
				if want := fmt.Sprintf("reason of %d bytes", len(v.Get("reason"))); !strings.Contains(msg, want) {
					t.Errorf("ParseNodeState(%q) error %q does not say %q", header, msg, want)
				}
			}
		} else {
			if !valid(s.SocketRedirect) {
				t.Errorf("ParseNodeState(%q) accepted socket-redirect %q", header, s.SocketRedirect)
			}
			if len(s.Reason) > MaxNodeStateReason+len("...") {
				t.Errorf("ParseNodeState(%q) accepted a reason of %d bytes", header, len(s.Reason))
			}
			want := NodeState{SocketRedirect: s.SocketRedirect, Reason: truncate(s.Reason, MaxNodeStateReason)}
			if again, err := ParseNodeState(s.Encode()); err != nil || again != want {
				t.Errorf("ParseNodeState(%q) = %+v, but its Encode %q parses to %+v, %v; want %+v", header, s, s.Encode(), again, err, want)
			}
		}

		// Whatever an agent encodes parses back.
		in := NodeState{SocketRedirect: states[int(state)%len(states)], Reason: reason}
		got, err := ParseNodeState(in.Encode())
		want := NodeState{SocketRedirect: in.SocketRedirect, Reason: truncate(reason, MaxNodeStateReason)}
		if err != nil || got != want {
			t.Errorf("ParseNodeState(%q) = %+v, %v; want %+v", in.Encode(), got, err, want)
		}
	})
}

func valid(s RedirectState) bool {
	switch s {
	case RedirectActive, RedirectSyncing, RedirectOff, RedirectUnavailable:
		return true
	}
	return false
}
