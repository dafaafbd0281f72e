package metrics

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sockscale/sockscale/agent/internal/podwatch"
	"github.com/sockscale/sockscale/agent/internal/sampler"
	"github.com/sockscale/sockscale/bpf"
)

func TestPodSeries(t *testing.T) {
	sample := &sampler.Sample{
		Time:   time.Unix(1700000000, 0),
		Events: bpf.Events{ParseError: 2, StreamGap: 3, Resync: 4, Adopted: 5, RxWait: 6},
		Pods: []sampler.PodSample{
			{
				IP:  netip.MustParseAddr("10.0.0.5"),
				Pod: podwatch.Pod{Namespace: "ns", Name: "web-1", Workload: "web"},
				Counters: bpf.PodCounters{
					Requests:      bpf.RequestCounters{InFlight: 3, Started: 13, Completed: 10, Area: 2500 * time.Millisecond},
					Proxied:       bpf.RequestCounters{InFlight: 1, Started: 2, Completed: 1, Area: time.Second},
					ConnsInFlight: 4, ConnsTotal: 9, ProbesTotal: 7,
				},
				Mode: sampler.ModeHTTP,
			},
			{IP: netip.MustParseAddr("10.0.0.6")}, // unknown to the watcher: no series
		},
	}
	reg := prometheus.NewPedanticRegistry()
	New(reg)
	RegisterSamples(reg, func() *sampler.Sample { return sample }, func() podwatch.Status {
		return podwatch.Status{Tracked: 2, Skipped: map[string]int{podwatch.SkipHostNetwork: 1}, Synced: true}
	})
	want := `
# HELP sockscale_agent_accounting_mode 1 for the pod's accounting mode in the last period: mode="http" (per request), "http2" (per request, some connections HTTP/2 with each stream a request) or "connection" (some connections were neither HTTP/1.x nor HTTP/2).
# TYPE sockscale_agent_accounting_mode gauge
sockscale_agent_accounting_mode{mode="connection",namespace="ns",pod="web-1",workload="web"} 0
sockscale_agent_accounting_mode{mode="http",namespace="ns",pod="web-1",workload="web"} 1
sockscale_agent_accounting_mode{mode="http2",namespace="ns",pod="web-1",workload="web"} 0
# HELP sockscale_agent_request_concurrency_seconds_total Time integral of requests in flight, in seconds; its rate() is the average concurrency.
# TYPE sockscale_agent_request_concurrency_seconds_total counter
sockscale_agent_request_concurrency_seconds_total{namespace="ns",pod="web-1",workload="web"} 2.5
# HELP sockscale_agent_requests_in_flight HTTP requests in flight in the pod (proxied ones included).
# TYPE sockscale_agent_requests_in_flight gauge
sockscale_agent_requests_in_flight{namespace="ns",pod="web-1",workload="web"} 3
# HELP sockscale_agent_requests_total HTTP requests the pod completed.
# TYPE sockscale_agent_requests_total counter
sockscale_agent_requests_total{namespace="ns",pod="web-1",workload="web"} 10
# HELP sockscale_agent_proxied_requests_total Completed requests that came through an activator.
# TYPE sockscale_agent_proxied_requests_total counter
sockscale_agent_proxied_requests_total{namespace="ns",pod="web-1",workload="web"} 1
# HELP sockscale_agent_probes_total Health-probe requests (kubelet, sockscale) not counted as load.
# TYPE sockscale_agent_probes_total counter
sockscale_agent_probes_total{namespace="ns",pod="web-1",workload="web"} 7
# HELP sockscale_agent_kernel_events_total What the kernel side could not account exactly, or took up late, by event: conn_untracked, parse_limit, parse_error, stream_gap (client bytes never seen), resync (a lost stream found again), adopted (a connection open before the programs, taken up at its next request), h2_full (an HTTP/2 stream beyond the 128 followed on its connection, not counted), h2_lost (HTTP/2 frames not followed: the connection counted as one request from then on), rx_wait (a client segment waited while another CPU walked its connection's bytes: not a loss), rx_takeover (it waited far longer than a walk takes and walked all the same: a claim nobody gave back).
# TYPE sockscale_agent_kernel_events_total counter
sockscale_agent_kernel_events_total{event="adopted"} 5
sockscale_agent_kernel_events_total{event="conn_untracked"} 0
sockscale_agent_kernel_events_total{event="h2_full"} 0
sockscale_agent_kernel_events_total{event="h2_lost"} 0
sockscale_agent_kernel_events_total{event="parse_error"} 2
sockscale_agent_kernel_events_total{event="parse_limit"} 0
sockscale_agent_kernel_events_total{event="resync"} 4
sockscale_agent_kernel_events_total{event="rx_takeover"} 0
sockscale_agent_kernel_events_total{event="rx_wait"} 6
sockscale_agent_kernel_events_total{event="stream_gap"} 3
# HELP sockscale_agent_skipped_pods Pods on this node not accounted, by reason: host_network.
# TYPE sockscale_agent_skipped_pods gauge
sockscale_agent_skipped_pods{reason="host_network"} 1
# HELP sockscale_agent_tracked_pods Pods whose requests this agent accounts.
# TYPE sockscale_agent_tracked_pods gauge
sockscale_agent_tracked_pods 2
`
	names := []string{"sockscale_agent_accounting_mode", "sockscale_agent_request_concurrency_seconds_total",
		"sockscale_agent_requests_in_flight", "sockscale_agent_requests_total", "sockscale_agent_proxied_requests_total",
		"sockscale_agent_probes_total", "sockscale_agent_kernel_events_total", "sockscale_agent_skipped_pods", "sockscale_agent_tracked_pods"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg, "sockscale_agent_requests_in_flight"); err != nil || n != 1 {
		t.Errorf("requests_in_flight series = %d (%v), want 1: an unknown address gets none", n, err)
	}
}

func TestNoSampleYet(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	New(reg)
	RegisterSamples(reg, func() *sampler.Sample { return nil }, func() podwatch.Status { return podwatch.Status{} })
	if n, err := testutil.GatherAndCount(reg, "sockscale_agent_requests_in_flight"); err != nil || n != 0 {
		t.Errorf("series before the first sample = %d (%v), want 0", n, err)
	}
}
