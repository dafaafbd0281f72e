//go:build linux

package bpf

import (
	"testing"
	"time"
)

// BenchmarkProgKeepAliveRequest times the cgroup_skb programs themselves on
// one keep-alive request as Go's client and server write it: the request
// segment (ingress) and the response segment (egress), with the kernel's
// own clock (BPF_PROG_TEST_RUN), so the figure does not move with the
// machine's load the way end-to-end throughput does. Test-run packets are
// linear, so reads are a little cheaper than from a real socket's pages.
func BenchmarkProgKeepAliveRequest(b *testing.B) {
	const (
		request  = "GET /?n=1 HTTP/1.1\r\nHost: 10.213.0.2:8080\r\nUser-Agent: Go-http-client/1.1\r\nAccept-Encoding: gzip\r\n\r\n"
		response = "HTTP/1.1 200 OK\r\nDate: Sun, 22 Nov 2026 23:02:42 GMT\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nok"
	)
	h := newProgHarness(b)
	rx, tx := uint32(1000), uint32(5000)
	var inside [2]time.Duration // by direction: ingress, egress
	runs := 0
	for b.Loop() {
		for _, seg := range []struct {
			in      bool
			seq     *uint32
			payload string
		}{{true, &rx, request}, {false, &tx, response}} {
			prog, pkt := h.objs.SockscaleEgress, packet(h.pod, h.peer, testPodPort, testPeerPort, *seg.seq, []byte(seg.payload))
			if seg.in {
				prog, pkt = h.objs.SockscaleIngress, packet(h.peer, h.pod, testPeerPort, testPodPort, *seg.seq, []byte(seg.payload))
			}
			ret, took, err := prog.Benchmark(pkt, 1, nil)
			if err != nil || ret != 1 {
				b.Fatalf("test run: ret=%d err=%v", ret, err)
			}
			if seg.in {
				inside[0] += took
			} else {
				inside[1] += took
			}
			*seg.seq += uint32(len(seg.payload))
		}
		runs++
	}
	if s := h.stats(); s.All.Completed != uint64(runs) || s.All.InFlight != 0 {
		b.Fatalf("after %d requests: %+v", runs, s.All)
	}
	b.ReportMetric(float64((inside[0]+inside[1]).Nanoseconds())/float64(runs), "bpf-ns/request")
	b.ReportMetric(float64(inside[0].Nanoseconds())/float64(runs), "ingress-ns/request")
	b.ReportMetric(float64(inside[1].Nanoseconds())/float64(runs), "egress-ns/request")
}
