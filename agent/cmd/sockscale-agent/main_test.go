package main

import (
	"strings"
	"testing"
)

func TestFlagErrorsNameValueAndAllowed(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--node-name="}, "--node-name is empty"},
		{[]string{"--node-name=n", "--report-period=10ms"}, "--report-period=10ms: must be between 100ms and 1m"},
		{[]string{"--node-name=n", "--bpffs-dir=/"}, `--bpffs-dir="/"`},
		{[]string{"--node-name=n", "--metrics-bind-address=9090"}, `--metrics-bind-address="9090": want [host]:port`},
		{[]string{"--node-name=n", "--metrics-secure=false", "--metrics-cert-path=/etc/certs"}, `--metrics-cert-path="/etc/certs" needs --metrics-secure`},
		{[]string{"--node-name=n", "--controller-stats-address=controller"}, `--controller-stats-address="controller": want host:port`},
		{[]string{"--node-name=n", "--log-level=loud"}, `--log-level="loud": want debug, info, warn or error`},
		{[]string{"--node-name=n", "extra"}, "takes flags only"},
		{[]string{"--node-name=n", "--socket-redirect=yes"}, `--socket-redirect="yes": want auto, on or off`},
		{[]string{"--node-name=n", "--activator-port=0"}, "--activator-port=0: want 1..65535"},
		{[]string{"--node-name=n", "--socket-redirect=on", "--activator-selector="}, "--socket-redirect=on needs --activator-selector"},
		{[]string{"--node-name=n", "--activator-selector=app in ("}, `--activator-selector="app in ("`},
		{[]string{"--node-name=n", "--activator-namespace="}, `--activator-namespace="": want the namespace the activators run in`},
		{[]string{"--node-name=n", "--activator-namespace=Team A"}, `--activator-namespace="Team A": want the namespace the activators run in`},
		{[]string{"--node-name=n", "--drain-bind-address=9094"}, `--drain-bind-address="9094": want host:port on the node's loopback`},
		{[]string{"--node-name=n", "--drain-min-wait=2m"}, "--drain-min-wait=2m0s: want 100ms..1m"},
	}
	for _, tt := range tests {
		t.Setenv("NODE_NAME", "")
		t.Setenv("POD_NAMESPACE", "sockscale-system")
		_, err := parseFlags(tt.args)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: err = %v, want it to contain %q", tt.args, err, tt.want)
		}
	}
}

func TestFlagDefaults(t *testing.T) {
	t.Setenv("NODE_NAME", "node-a")
	t.Setenv("POD_NAMESPACE", "ops")
	c, err := parseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.nodeName != "node-a" || c.cgroupRoot != "/sys/fs/cgroup" || c.bpffsDir != "/sys/fs/bpf/sockscale" || c.reportPeriod.String() != "1s" {
		t.Errorf("defaults = %+v", c)
	}
	if !c.metrics.Secure || c.metrics.CertDir != "" {
		t.Errorf("--metrics-secure=%v --metrics-cert-path=%q, want HTTPS with a self-signed certificate", c.metrics.Secure, c.metrics.CertDir)
	}
	if c.activatorNamespace != "ops" {
		t.Errorf("--activator-namespace=%q, want the agent's own namespace ops", c.activatorNamespace)
	}
	if c.socketRedirect != "auto" || c.activatorPort != 8012 {
		t.Errorf("--socket-redirect=%q --activator-port=%d, want auto and 8012 (the activator's proxy port)", c.socketRedirect, c.activatorPort)
	}
	t.Setenv("POD_NAMESPACE", "")
	if _, err := parseFlags([]string{"--uninstall"}); err != nil {
		t.Errorf("--uninstall needs no node name: %v", err)
	}
}
