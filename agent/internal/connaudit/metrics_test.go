package connaudit

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sockscale/sockscale/agent/internal/podwatch"
	"github.com/sockscale/sockscale/bpf"
)

type podsByAddr map[netip.Addr]podwatch.Pod

func (p podsByAddr) Accounted() []netip.Addr { return nil }
func (p podsByAddr) Lookup(ip netip.Addr) (podwatch.Pod, bool) {
	pod, ok := p[ip]
	return pod, ok
}

// TestMiscountedOncePerPod: a dual-stack pod's two addresses are checked
// apart; the gauge has one series for the pod, their differences added
// (two series with the same labels would fail the whole scrape).
func TestMiscountedOncePerPod(t *testing.T) {
	v4, v6, other := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fd5c:a1e:0:1::5"), netip.MustParseAddr("10.0.0.6")
	web := podwatch.Pod{Namespace: "shop", Name: "web-1", Workload: "web", IP: v4}
	reg := prometheus.NewRegistry()
	a := New(nil, podsByAddr{v4: web, v6: web, other: {Namespace: "shop", Name: "api-1", Workload: "api", IP: other}}, Options{Registerer: reg})
	a.last[v4] = bpf.Audit{Unseen: 2}
	a.last[v6] = bpf.Audit{Unseen: 1}
	a.last[other] = bpf.Audit{Gone: 1}
	want := `
# HELP sockscale_agent_connections_miscounted ` + miscountedHelp + `
# TYPE sockscale_agent_connections_miscounted gauge
sockscale_agent_connections_miscounted{namespace="shop",pod="api-1",workload="api"} 1
sockscale_agent_connections_miscounted{namespace="shop",pod="web-1",workload="web"} -3
`
	if err := promtestutil.GatherAndCompare(reg, strings.NewReader(want), "sockscale_agent_connections_miscounted"); err != nil {
		t.Error(err)
	}
}
