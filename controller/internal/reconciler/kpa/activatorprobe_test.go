package kpa

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sockscale/sockscale/internal/activatorprobe"
)

func TestActivatorInPath(t *testing.T) {
	activator := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !activatorprobe.IsProbe(r) || !strings.HasPrefix(r.UserAgent(), "sockscale-probe/") {
			t.Errorf("probe arrived with headers %v", r.Header)
		}
		w.Header().Set(activatorprobe.ResponseHeader, "activator-0")
	}))
	defer activator.Close()
	pod := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("hello from the pod"))
	}))
	defer pod.Close()
	// A tenant's pod that redirects the probe elsewhere (an activator
	// here, or anything the controller can reach): not followed.
	redirector := httptest.NewServer(http.RedirectHandler(activator.URL+"/", http.StatusFound))
	defer redirector.Close()
	closed := httptest.NewServer(http.NotFoundHandler())
	closedAddr := closed.Listener.Addr().String()
	closed.Close()

	tests := []struct {
		name    string
		addr    string
		want    bool
		wantErr bool
	}{
		{"an activator answers", activator.Listener.Addr().String(), true, false},
		{"the pod answers: not yet", pod.Listener.Addr().String(), false, false},
		{"the pod redirects to an activator: not followed", redirector.Listener.Addr().String(), false, false},
		{"nothing listens", closedAddr, false, true},
	}
	for _, tt := range tests {
		p := &HTTPProber{Resolve: func(context.Context, string, string, int32) (string, error) { return tt.addr, nil }}
		got, err := p.ActivatorInPath(context.Background(), "default", "hello", 0)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("%s: got %v, %v; want %v, error %v", tt.name, got, err, tt.want, tt.wantErr)
		}
	}
}
