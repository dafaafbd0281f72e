package target

import (
	"net/http/httptest"
	"strings"
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

func TestValidateActivatorSettings(t *testing.T) {
	k := Key{"default", "hello"}
	for _, tc := range []struct {
		name string
		t    Target
		want string // "" valid
	}{
		{"health checks by path", Target{Key: k, HealthChecks: &HealthChecks{Paths: []string{"/healthz"}, Status: 200}}, ""},
		{"health checks matching everything", Target{Key: k, HealthChecks: &HealthChecks{Status: 200}}, "healthChecks: needs paths, userAgents or both"},
		{"health check status 100", Target{Key: k, HealthChecks: &HealthChecks{UserAgents: []string{"x"}, Status: 100}}, "healthChecks.status 100: must be from 200 to 599"},
		{"negative queue depth", Target{Key: k, QueueDepth: -1}, "queueDepth -1: must be 0"},
	} {
		err := tc.t.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: Validate = %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestHealthChecksMatch(t *testing.T) {
	for _, tc := range []struct {
		name           string
		h              HealthChecks
		method, target string
		ua             string
		want           bool
	}{
		{"path", HealthChecks{Paths: []string{"/healthz"}}, "GET", "/healthz?x=1", "anyone", true},
		{"other path", HealthChecks{Paths: []string{"/healthz"}}, "GET", "/healthz/", "anyone", false},
		{"HEAD", HealthChecks{Paths: []string{"/healthz"}}, "HEAD", "/healthz", "", true},
		{"POST is never one", HealthChecks{Paths: []string{"/healthz"}}, "POST", "/healthz", "", false},
		{"user agent part", HealthChecks{UserAgents: []string{"GoogleHC"}}, "GET", "/any", "GoogleHC/1.0", true},
		{"user agent is case-sensitive", HealthChecks{UserAgents: []string{"GoogleHC"}}, "GET", "/any", "googlehc/1.0", false},
		{"path and user agent both", HealthChecks{Paths: []string{"/"}, UserAgents: []string{"kube-probe"}}, "GET", "/", "Mozilla/5.0", false},
	} {
		r := httptest.NewRequest(tc.method, tc.target, nil)
		r.Header.Set("User-Agent", tc.ua)
		if got := tc.h.Matches(r); got != tc.want {
			t.Errorf("%s: Matches = %v, want %v", tc.name, got, tc.want)
		}
	}
}
