package handler

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestReadyzWaitsForReady: /readyz fails, saying why, until Ready is
// satisfied (the activator's targets are synced), and fails again on drain.
func TestReadyzWaitsForReady(t *testing.T) {
	why := errors.New("targets not synced yet")
	health := &Health{Ready: func() error { return why }}
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		health.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get(); code != http.StatusServiceUnavailable || !strings.Contains(body, "targets not synced yet") {
		t.Errorf("before ready: %d %q, want 503 naming why", code, body)
	}
	why = nil
	if code, _ := get(); code != http.StatusOK {
		t.Errorf("ready: %d, want 200", code)
	}
	health.Drain()
	if code, body := get(); code != http.StatusServiceUnavailable || !strings.Contains(body, "draining") {
		t.Errorf("draining: %d %q, want 503 saying draining", code, body)
	}
}
