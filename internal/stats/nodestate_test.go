package stats

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestNodeStateRoundTrip(t *testing.T) {
	for _, s := range []NodeState{
		{SocketRedirect: RedirectActive},
		{SocketRedirect: RedirectSyncing, Reason: "watch ServerlessServices: forbidden & retried; 100% = \"all\""},
		{SocketRedirect: RedirectOff, Reason: "--socket-redirect=off"},
		{SocketRedirect: RedirectUnavailable, Reason: "the kernel cannot load cgroup/connect4: operation not permitted"},
	} {
		h := s.Encode()
		got, err := ParseNodeState(h)
		if err != nil {
			t.Errorf("%+v: parse %q: %v", s, h, err)
			continue
		}
		if got != s {
			t.Errorf("round trip of %+v through %q gave %+v", s, h, got)
		}
	}
}

func TestNodeStateLongReasonIsCut(t *testing.T) {
	// 'é' is two bytes: the cut at MaxNodeStateReason falls inside one.
	reason := "x" + strings.Repeat("é", MaxNodeStateReason)
	got, err := ParseNodeState(NodeState{SocketRedirect: RedirectUnavailable, Reason: reason}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(got.Reason, "...") || len(got.Reason) > MaxNodeStateReason+3 || !utf8.ValidString(got.Reason) {
		t.Errorf("reason of %d bytes came back as %d bytes %q..., want at most %d + \"...\", valid UTF-8", len(reason), len(got.Reason), got.Reason[:10], MaxNodeStateReason)
	}
	if !strings.HasPrefix(reason, strings.TrimSuffix(got.Reason, "...")) {
		t.Errorf("the cut reason is not a prefix of the reason")
	}
}

func TestParseNodeStateErrors(t *testing.T) {
	for _, tt := range []struct{ header, want string }{
		{"socket-redirect=degraded", `socket-redirect="degraded": want active, syncing, off or unavailable`},
		{"reason=no+state", `socket-redirect="": want active`},
		{"socket-redirect=active;x", "invalid semicolon"},
		{"socket-redirect=%zz", "invalid URL escape"},
		{"socket-redirect=off&reason=" + strings.Repeat("r", 300), "reason of 300 bytes: at most 256 allowed"},
	} {
		_, err := ParseNodeState(tt.header)
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), HeaderNodeState) {
			t.Errorf("ParseNodeState(%.40q) = %v, want an error naming %s and %q", tt.header, err, HeaderNodeState, tt.want)
		}
	}
	// Keys a later agent may add are ignored.
	if s, err := ParseNodeState("socket-redirect=active&later-key=1"); err != nil || s.SocketRedirect != RedirectActive {
		t.Errorf("unknown key: %+v, %v; want it ignored", s, err)
	}
}
