package target

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseKey(t *testing.T) {
	tests := []struct {
		in   string
		want Key
		ok   bool
	}{
		{"default/hello", Key{"default", "hello"}, true},
		{"hello", Key{}, false},
		{"/hello", Key{}, false},
		{"default/", Key{}, false},
		{"a/b/c", Key{}, false},
		{"Default/Hello", Key{}, false},
		{"ns/a b", Key{}, false},
		{"ns/1abc", Key{}, false},
	}
	for _, tt := range tests {
		got, err := ParseKey(tt.in)
		if (err == nil) != tt.ok {
			t.Errorf("ParseKey(%q) error = %v, want ok %v", tt.in, err, tt.ok)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("ParseKey(%q) (-want +got):\n%s", tt.in, diff)
		}
	}
}

func TestRequestTimeout(t *testing.T) {
	if got := (&Target{}).RequestTimeout(); got != 300*time.Second {
		t.Errorf("default = %v, want 5m", got)
	}
	if got := (&Target{Timeout: time.Minute}).RequestTimeout(); got != time.Minute {
		t.Errorf("set = %v, want 1m", got)
	}
}

func TestValidateOneMode(t *testing.T) {
	k := Key{"default", "hello"}
	for _, tc := range []struct {
		proxy, serve, ok bool
	}{{false, false, true}, {true, false, true}, {false, true, true}, {true, true, false}} {
		err := (&Target{Key: k, Proxy: tc.proxy, Serve: tc.serve}).Validate()
		if (err == nil) != tc.ok {
			t.Errorf("Proxy %v, Serve %v: Validate = %v, want ok %v", tc.proxy, tc.serve, err, tc.ok)
		}
	}
}
