package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sockscale/sockscale/internal/activatorprobe"
)

func TestFlags(t *testing.T) {
	t.Setenv("POD_NAME", "activator-0")
	tests := []struct {
		name string
		args []string
		errs []string // substrings; none: valid
	}{
		{name: "defaults", args: nil},
		{name: "queue depth 0", args: []string{"--queue-depth=0"}, errs: []string{"--queue-depth=0: must be from 1 to 1000000"}},
		{name: "queue depth too deep", args: []string{"--queue-depth=2000000"}, errs: []string{"--queue-depth=2000000: must be from 1 to 1000000"}},
		{name: "probe period", args: []string{"--probe-period=0s", "--probe-timeout=1m"},
			errs: []string{"--probe-period=0s: must be from 1ms to 10s", "--probe-timeout=1m0s: must be from 1ms to 10s"}},
		{name: "drain delay not below grace", args: []string{"--drain-delay=30s"}, errs: []string{"--drain-delay=30s: must be from 0 to less than --shutdown-grace-period (30s)"}},
		{name: "grace", args: []string{"--shutdown-grace-period=0s", "--drain-delay=0s"}, errs: []string{"--shutdown-grace-period=0s: must be from 1s to 1h"}},
		{name: "address", args: []string{"--proxy-bind-address=8012"}, errs: []string{`--proxy-bind-address="8012": want [host]:port`}},
		{name: "cluster domain", args: []string{"--cluster-domain="}, errs: []string{`--cluster-domain="": want a DNS domain`}},
		{name: "pod name", args: []string{"--pod-name="}, errs: []string{"--pod-name is empty: set it or $POD_NAME"}},
		{name: "arguments", args: []string{"extra"}, errs: []string{`unexpected arguments ["extra"]`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseFlags(tt.args)
			var got []string
			if err != nil {
				for _, want := range tt.errs {
					if strings.Contains(err.Error(), want) {
						got = append(got, want)
					}
				}
				if len(got) == 0 {
					got = []string{err.Error()}
				}
			}
			if diff := cmp.Diff(tt.errs, got); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRun starts the binary's run loop, checks that it answers an
// activator probe and refuses an unknown host, and that a stop drains and
// returns.
func TestRun(t *testing.T) {
	t.Setenv("POD_NAME", "activator-0")
	addrs := freeAddrs(t, 3)
	cfg, err := parseFlags([]string{"--proxy-bind-address=" + addrs[0], "--metrics-bind-address=" + addrs[1],
		"--health-probe-bind-address=" + addrs[2], "--drain-delay=0s", "--shutdown-grace-period=1s"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, slog.New(slog.DiscardHandler)) }()

	get := func(url string, hdr ...string) (int, string, http.Header) {
		deadline := time.Now().Add(10 * time.Second)
		for {
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			for i := 0; i+1 < len(hdr); i += 2 {
				req.Header.Set(hdr[i], hdr[i+1])
			}
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				return resp.StatusCode, string(body), resp.Header
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s: %v", url, err)
			}
			time.Sleep(10 * time.Millisecond) // the server is starting
		}
	}
	if code, _, h := get("http://"+addrs[0]+"/", activatorprobe.Header, activatorprobe.Value); code != 200 || h.Get(activatorprobe.ResponseHeader) != "activator-0" {
		t.Errorf("activator probe: %d, %s=%q", code, activatorprobe.ResponseHeader, h.Get(activatorprobe.ResponseHeader))
	}
	if code, body, _ := get("http://" + addrs[0] + "/"); code != 404 || !strings.Contains(body, "is not the ClusterIP of any target") {
		t.Errorf("unknown host: %d %q", code, body)
	}
	if code, _, _ := get("http://" + addrs[2] + "/readyz"); code != 200 {
		t.Errorf("/readyz: %d", code)
	}
	if code, body, _ := get("http://" + addrs[1] + "/metrics"); code != 200 || !strings.Contains(body, "sockscale_activator_probes_total") {
		t.Errorf("/metrics: %d, activator series missing", code)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after stop")
	}
}

func freeAddrs(t *testing.T, n int) []string {
	var addrs []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, ln.Addr().String())
		defer ln.Close()
	}
	return addrs
}
