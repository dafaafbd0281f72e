//go:build linux

package bpf

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/go-cmp/cmp"

	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// progHarness runs the cgroup_skb programs on crafted packets with
// BPF_PROG_TEST_RUN. sock_ops cannot be test-run, so the harness creates the
// connection entry that PASSIVE_ESTABLISHED would, in the four-tuple map of
// the test object (accountingtest, see gen.go); the kernel tests cover the
// production object and the socket storage that real connections use.
type progHarness struct {
	t    testing.TB
	objs accountingtestObjects
	ipv6 bool // the pod and its client talk IPv6
	pod  netip.Addr
	peer netip.Addr
	key  accountingtestConnKey
}

const (
	testPodPort  = 8080
	testPeerPort = 40000
	testPodID    = 0xfeedface
	testTenure   = 0x7e4e
	testSlot     = 3 // not 0, so a slot the programs ignore would show
)

func newProgHarness(t testing.TB) *progHarness {
	t.Helper()
	return newFamilyHarness(t, false)
}

// newFamilyHarness is newProgHarness whose pod and client talk IPv6 if
// ipv6 is set.
func newFamilyHarness(t testing.TB, ipv6 bool) *progHarness {
	t.Helper()
	testenv.RequireRoot(t)
	h := &progHarness{t: t, ipv6: ipv6}
	// Test runs get a new dummy socket each, so the test object keeps
	// connections by four-tuple (see SOCKSCALE_TEST_TUPLE in lib/conn.h).
	spec, err := loadAccountingtest()
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	if err := spec.LoadAndAssign(&h.objs, nil); err != nil {
		t.Fatalf("load objects: %v", err)
	}
	t.Cleanup(func() { h.objs.Close() })
	h.reset()
	return h
}

// reset gives the harness a fresh pod and connection on the same objects
// (the fuzz target reuses one load for all its inputs).
func (h *progHarness) reset() {
	t := h.t
	h.pod, h.peer = netip.MustParseAddr("10.213.0.2"), netip.MustParseAddr("10.213.0.1")
	if h.ipv6 {
		h.pod, h.peer = netip.MustParseAddr("fd5c:a1e:0:213::2"), netip.MustParseAddr("fd5c:a1e:0:213::1")
	}
	podKey, _ := ipKey(h.pod)
	peerKey, _ := ipKey(h.peer)
	if err := h.objs.PodCounters.Update(uint32(testSlot), &accountingPodStats{Ip: podKey, Id: testPodID, Tenure: testTenure}, ebpf.UpdateAny); err != nil {
		t.Fatalf("add pod: %v", err)
	}
	if err := h.objs.PodSlots.Update(podKey, uint32(testSlot), ebpf.UpdateAny); err != nil {
		t.Fatalf("add pod slot: %v", err)
	}
	// The client is the node (the kubelet's address), so its probes are
	// probes; tests of other clients remove it (setPeerKind).
	h.setPeerKind(peerNode)
	h.key = accountingtestConnKey{PodIp: podKey, PeerIp: peerKey, PodPort: htons(testPodPort), PeerPort: htons(testPeerPort)}
	for _, m := range []*ebpf.Map{h.objs.Stash, h.objs.H2Stash, h.objs.TestSockets} {
		if err := m.Delete(&h.key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Fatalf("clear %s: %v", m, err)
		}
	}
	zero := make([]uint64, ebpf.MustPossibleCPU())
	for ev := range uint32(evMax) {
		if err := h.objs.Events.Update(ev, zero, ebpf.UpdateAny); err != nil {
			t.Fatalf("clear events: %v", err)
		}
	}
	h.connect(1000, 5000, false)
}

// family is one address family the table tests run their cases in.
type family struct {
	name    string
	harness func(t *testing.T) *progHarness // a fresh pod and connection for one case
}

// families are IPv4, each case on a harness of its own, and IPv6, every
// case on one harness reset in between (loading the test object is the
// slow part of a case, and the same cases have run on their own in IPv4).
// parent owns the IPv6 harness's objects.
func families(parent *testing.T) []family {
	var h6 *progHarness
	return []family{
		{"IPv4", func(t *testing.T) *progHarness { return newProgHarness(t) }},
		{"IPv6", func(t *testing.T) *progHarness {
			if h6 == nil {
				h6 = newFamilyHarness(parent, true)
			}
			h6.t = t
			h6.reset()
			return h6
		}},
	}
}

// Who the harness's client is to the programs (peer_kind in lib/maps.h).
type peerKind int

const (
	peerOther peerKind = iota
	peerNode
	peerActivator
	peerAnyIsNode // any client, by 0.0.0.0 among the node's addresses (--probe-sources=any)
)

// setPeerKind makes the harness's client the node, an activator or any
// other client for the connections accepted from now on.
func (h *progHarness) setPeerKind(k peerKind) {
	h.t.Helper()
	peerKey, _ := ipKey(h.peer)
	anyKey, _ := ipKey(netip.IPv4Unspecified())
	for _, m := range []struct {
		m    *ebpf.Map
		want bool
		key  accountingIpAddr
	}{{h.objs.NodeAddrs, k == peerNode, peerKey}, {h.objs.Activators, k == peerActivator, peerKey}, {h.objs.NodeAddrs, k == peerAnyIsNode, anyKey}} {
		var err error
		if m.want {
			err = m.m.Update(m.key, uint8(1), ebpf.UpdateAny)
		} else if err = m.m.Delete(m.key); errors.Is(err, ebpf.ErrKeyNotExist) {
			err = nil
		}
		if err != nil {
			h.t.Fatalf("set peer kind: %v", err)
		}
	}
}

// connect replaces the connection entry, as an accept would.
func (h *progHarness) connect(rxNext, txNext uint32, proxied bool) {
	h.t.Helper()
	c := accountingConn{Tenure: testTenure, Slot: testSlot, RxNext: rxNext, TxNext: txNext}
	c.Rx.Hash, c.Tx.Hash = fnvOffset, fnvOffset
	if proxied {
		c.Proxied = 1
	}
	if err := h.objs.Conns.Update(&h.key, &c, ebpf.UpdateAny); err != nil {
		h.t.Fatalf("add conn: %v", err)
	}
	// A new connection on the same four-tuple: no HTTP/2 state of the last.
	if err := h.objs.H2Conns.Delete(&h.key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		h.t.Fatalf("remove HTTP/2 state: %v", err)
	}
}

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// packet builds an Ethernet frame with an IPv4 or IPv6 header (src's
// family) and a TCP header, without options: the payload starts at
// ipTCPHeaderLen of an IPv4 packet, ip6TCPHeaderLen of an IPv6 one.
func packet(src, dst netip.Addr, sport, dport uint16, seq uint32, payload []byte) []byte {
	return packetFlags(src, dst, sport, dport, seq, tcpPSH|tcpACK, payload)
}

// TCP flags of crafted packets.
const (
	tcpSYN = 0x02
	tcpPSH = 0x08
	tcpACK = 0x10
)

// ip6TCPHeaderLen is where an IPv6 crafted packet's payload starts.
const ip6TCPHeaderLen = 60

// packetFlags is packet with the given TCP flags.
func packetFlags(src, dst netip.Addr, sport, dport uint16, seq uint32, flags byte, payload []byte) []byte {
	var b, tcp []byte
	if src.Is6() {
		b = make([]byte, 14+ip6TCPHeaderLen+len(payload))
		binary.BigEndian.PutUint16(b[12:], 0x86dd)
		ip := b[14:]
		ip[0] = 6 << 4
		binary.BigEndian.PutUint16(ip[4:], uint16(20+len(payload)))
		ip[6] = 6 // TCP
		ip[7] = 64
		s, d := src.As16(), dst.As16()
		copy(ip[8:], s[:])
		copy(ip[24:], d[:])
		tcp = ip[40:]
	} else {
		b = make([]byte, 14+ipTCPHeaderLen+len(payload))
		binary.BigEndian.PutUint16(b[12:], 0x0800)
		ip := b[14:]
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(ipTCPHeaderLen+len(payload)))
		ip[8] = 64
		ip[9] = 6 // TCP
		s, d := src.As4(), dst.As4()
		copy(ip[12:], s[:])
		copy(ip[16:], d[:])
		tcp = ip[20:]
	}
	binary.BigEndian.PutUint16(tcp[0:], sport)
	binary.BigEndian.PutUint16(tcp[2:], dport)
	binary.BigEndian.PutUint32(tcp[4:], seq)
	tcp[12] = 5 << 4
	tcp[13] = flags
	copy(tcp[20:], payload)
	return b
}

// setAck writes a crafted packet's TCP acknowledgment number.
func setAck(pkt []byte, ack uint32) {
	tcp := 14 + 20
	if binary.BigEndian.Uint16(pkt[12:]) == 0x86dd {
		tcp = 14 + 40
	}
	binary.BigEndian.PutUint32(pkt[tcp+8:], ack)
}

func (h *progHarness) run(prog *ebpf.Program, pkt []byte) {
	h.t.Helper()
	ret, err := prog.Run(&ebpf.RunOptions{Data: pkt})
	if err != nil {
		h.t.Fatalf("test run: %v", err)
	}
	if ret != 1 {
		h.t.Fatalf("verdict = %d, want 1 (the programs never drop)", ret)
	}
}

// ingress sends client bytes at sequence number seq.
func (h *progHarness) ingress(seq uint32, payload string) {
	h.t.Helper()
	h.run(h.objs.SockscaleIngress, packet(h.peer, h.pod, testPeerPort, testPodPort, seq, []byte(payload)))
}

// listen sends client bytes at sequence number seq before the connection
// is accepted: they reach the listening socket, as the segment that
// completes the handshake does (TCP_DEFER_ACCEPT, a lost ACK) or a SYN that
// carries data (TCP Fast Open, syn).
func (h *progHarness) listen(seq uint32, payload string, syn bool) {
	h.t.Helper()
	flags := byte(tcpPSH | tcpACK)
	if syn {
		flags = tcpSYN
	}
	h.run(h.objs.SockscaleIngress, packetFlags(h.peer, h.pod, testPeerPort, testPodPort, seq, flags, []byte(payload)))
}

// disconnect removes the connection entry: the connection is not accepted yet.
func (h *progHarness) disconnect() {
	h.t.Helper()
	for _, m := range []*ebpf.Map{h.objs.Conns, h.objs.H2Conns} {
		if err := m.Delete(&h.key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			h.t.Fatalf("remove the connection's state: %v", err)
		}
	}
}

// accept does what sock_ops does when the connection is established, with
// the client's and the server's next sequence numbers, through the test
// object's sockscale_test_accept (sock_ops cannot be test-run).
func (h *progHarness) accept(rxNext, txNext uint32) {
	h.t.Helper()
	pkt := packetFlags(h.peer, h.pod, testPeerPort, testPodPort, rxNext, tcpACK, nil)
	setAck(pkt, txNext)
	h.run(h.objs.SockscaleTestAccept, pkt)
}

// events returns the event counters, summed over CPUs.
func (h *progHarness) events() [evMax]uint64 {
	h.t.Helper()
	var evs [evMax]uint64
	for ev := range evs {
		var perCPU []uint64
		if err := h.objs.Events.Lookup(uint32(ev), &perCPU); err != nil {
			h.t.Fatalf("read event %d: %v", ev, err)
		}
		for _, n := range perCPU {
			evs[ev] += n
		}
	}
	return evs
}

// egress sends server bytes at sequence number seq.
func (h *progHarness) egress(seq uint32, payload string) {
	h.t.Helper()
	h.run(h.objs.SockscaleEgress, packet(h.pod, h.peer, testPodPort, testPeerPort, seq, []byte(payload)))
}

func (h *progHarness) stats() accountingPodStats {
	h.t.Helper()
	var v accountingPodStats
	if err := h.objs.PodCounters.LookupWithFlags(uint32(testSlot), &v, ebpf.LookupLock); err != nil {
		h.t.Fatalf("read pod: %v", err)
	}
	return v
}

func (h *progHarness) conn() accountingConn {
	h.t.Helper()
	var c accountingConn
	if err := h.objs.Conns.Lookup(&h.key, &c); err != nil {
		h.t.Fatalf("read conn: %v", err)
	}
	return c
}

// counts is what the table tests assert.
type counts struct {
	InFlight, Started, Completed        int64
	ProxiedInFlight, ProxiedStarted     int64
	Probes, OpaqueInFlight, OpaqueTotal int64
}

func (h *progHarness) counts() counts {
	s := h.stats()
	return counts{
		InFlight: s.All.InFlight, Started: int64(s.All.Started), Completed: int64(s.All.Completed),
		ProxiedInFlight: s.Proxied.InFlight, ProxiedStarted: int64(s.Proxied.Started),
		Probes: int64(s.ProbesTotal), OpaqueInFlight: s.OpaqueInFlight, OpaqueTotal: int64(s.OpaqueTotal),
	}
}

// seg is one segment of a scripted exchange; seq offsets are relative to
// the connection's initial sequence numbers (1000 client, 5000 server).
type seg struct {
	in   bool
	off  uint32
	data string
}

func in(off uint32, data string) seg  { return seg{true, off, data} }
func out(off uint32, data string) seg { return seg{false, off, data} }

const get = "GET /x HTTP/1.1\r\nHost: hello\r\nUser-Agent: hey/1.0\r\n\r\n"

// slowGet is a request with a header line long enough to cut anywhere.
const slowGet = "GET / HTTP/1.1\r\nHost: a\r\nX-Long: 0123456789\r\n\r\n"

func TestProgRequestRules(t *testing.T) {
	ok5 := "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello"
	chunked := "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n1a;ext=1\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nTrailer: x\r\n\r\n"
	tests := []struct {
		name    string
		proxied bool
		segs    []seg
		want    counts
	}{
		{"request in flight until its response", false,
			[]seg{in(0, get)}, counts{InFlight: 1, Started: 1}},
		{"content-length response completes it", false,
			[]seg{in(0, get), out(0, ok5)}, counts{Started: 1, Completed: 1}},
		{"response body split over segments", false,
			[]seg{in(0, get), out(0, ok5[:len(ok5)-4]), out(uint32(len(ok5)-4), "el"), out(uint32(len(ok5)-2), "lo")},
			counts{Started: 1, Completed: 1}},
		{"response split before the body: not complete yet", false,
			[]seg{in(0, get), out(0, ok5[:20])}, counts{InFlight: 1, Started: 1}},
		{"a request whose headers are not all in is not counted yet", false,
			[]seg{in(0, get[:30])}, counts{}},
		{"a request counts from its headers' end", false,
			[]seg{in(0, get[:30]), in(30, get[30:len(get)-2])}, counts{}},
		{"the empty line that ends the headers counts it", false,
			[]seg{in(0, get[:30]), in(30, get[30:len(get)-2]), in(uint32(len(get)-2), "\r\n")}, counts{InFlight: 1, Started: 1}},
		{"a request body still to come: counted from the headers' end", false,
			[]seg{in(0, "POST /u HTTP/1.1\r\nContent-Length: 10\r\n\r\n01234")}, counts{InFlight: 1, Started: 1}},
		{"a probe's User-Agent in a later segment is still a probe", false,
			[]seg{in(0, "GET /healthz HTTP/1.1\r\n"), in(23, "User-Agent: kube-probe/1.36\r\n\r\n"), out(0, ok5)},
			counts{Probes: 1}},
		{"headers the parser loses count from where it lost them", false,
			[]seg{in(0, get), out(0, ok5), in(uint32(len(get)), "GET / HTTP/1.1\r\nContent-Length: x\r\n")},
			counts{InFlight: 1, Started: 2, Completed: 1}},
		{"headers lost to a hole count from where they were lost", false,
			// The last segment fills the hole; TCP then delivers the bytes
			// seen ahead of it, which ingress never sees again.
			[]seg{in(0, slowGet[:25]), in(35, slowGet[35:]), in(25, slowGet[25:35])},
			counts{InFlight: 1, Started: 1}},
		{"a first request with malformed headers is accounted at connection level", false,
			[]seg{in(0, "GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n")},
			counts{InFlight: 1, Started: 1, OpaqueInFlight: 1, OpaqueTotal: 1}},
		{"request split over segments starts once", false,
			[]seg{in(0, get[:7]), in(7, get[7:]), out(0, ok5)}, counts{Started: 1, Completed: 1}},
		{"retransmitted request after the response is no new request", false,
			[]seg{in(0, get), out(0, ok5), in(0, get)}, counts{Started: 1, Completed: 1}},
		{"retransmitted response completes once", false,
			[]seg{in(0, get), out(0, ok5), in(uint32(len(get)), get), out(0, ok5)},
			counts{InFlight: 1, Started: 2, Completed: 1}},
		{"retransmission carrying new bytes at its end", false,
			[]seg{in(0, get), out(0, ok5[:30]), out(0, ok5)}, counts{Started: 1, Completed: 1}},
		{"keep-alive: second request on the connection", false,
			[]seg{in(0, get), out(0, ok5), in(uint32(len(get)), get), out(uint32(len(ok5)), ok5)},
			counts{Started: 2, Completed: 2}},
		{"chunked response with extensions and trailers", false,
			[]seg{in(0, get), out(0, chunked)}, counts{Started: 1, Completed: 1}},
		{"chunked response cut inside a chunk-size line", false,
			[]seg{in(0, get), out(0, chunked[:60]), out(60, chunked[60:80]), out(80, chunked[80:])},
			counts{Started: 1, Completed: 1}},
		{"chunked response without its last chunk is in flight", false,
			[]seg{in(0, get), out(0, chunked[:len(chunked)-20])}, counts{InFlight: 1, Started: 1}},
		{"HEAD response has no body", false,
			[]seg{in(0, "HEAD / HTTP/1.1\r\nHost: a\r\n\r\n"), out(0, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")},
			counts{Started: 1, Completed: 1}},
		{"204 has no body", false,
			[]seg{in(0, get), out(0, "HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n")}, counts{Started: 1, Completed: 1}},
		{"304 has no body", false,
			[]seg{in(0, get), out(0, "HTTP/1.1 304 Not Modified\r\n\r\n")}, counts{Started: 1, Completed: 1}},
		{"100 Continue is not the response", false,
			[]seg{in(0, "POST /u HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n"), out(0, "HTTP/1.1 100 Continue\r\n\r\n")},
			counts{InFlight: 1, Started: 1}},
		{"100 Continue then the final response", false,
			[]seg{in(0, "POST /u HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n"), out(0, "HTTP/1.1 100 Continue\r\n\r\n"),
				in(61, "abc"), out(25, ok5)},
			counts{Started: 1, Completed: 1}},
		{"101 upgrade stays in flight until close", false,
			[]seg{in(0, "GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"), out(0, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"), out(60, "\x81\x05hello")},
			counts{InFlight: 1, Started: 1}},
		{"response without length lasts until close", false,
			[]seg{in(0, get), out(0, "HTTP/1.0 200 OK\r\n\r\nsome bytes"), out(29, "more")},
			counts{InFlight: 1, Started: 1}},
		{"request body does not start requests", false,
			[]seg{in(0, "POST /u HTTP/1.1\r\nContent-Length: 10\r\n\r\n"), in(40, "0123456789"), out(0, ok5)},
			counts{Started: 1, Completed: 1}},
		{"kubelet probe is not load", false,
			[]seg{in(0, "GET /healthz HTTP/1.1\r\nHost: 10.0.0.1:8080\r\nUser-Agent: kube-probe/1.36\r\nAccept: */*\r\n\r\n"), out(0, ok5)},
			counts{Probes: 1}},
		{"probe user agent is matched case-sensitively in value, any case in name", false,
			[]seg{in(0, "GET /healthz HTTP/1.1\r\nuser-AGENT:kube-probe/1.36\r\n\r\n")},
			counts{Probes: 1}},
		{"sockscale probe is not load", false,
			[]seg{in(0, "GET / HTTP/1.1\r\nUser-Agent: sockscale-probe/0.1\r\n\r\n"), out(0, ok5), in(51, get), out(uint32(len(ok5)), ok5)},
			counts{Probes: 1, Started: 1, Completed: 1}},
		{"after a load request, the connection stays load: a probe on it counts", false,
			[]seg{in(0, get), out(0, ok5), in(uint32(len(get)), "GET /healthz HTTP/1.1\r\nUser-Agent: kube-probe/1.36\r\n\r\n"), out(uint32(len(ok5)), ok5)},
			counts{Started: 2, Completed: 2}},
		{"after a load request, HEAD is still known by its method", false,
			[]seg{in(0, get), out(0, ok5), in(uint32(len(get)), "HEAD /x HTTP/1.1\r\nHost: hello\r\nUser-Agent: hey/1.0\r\n\r\n"),
				out(uint32(len(ok5)), "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")},
			counts{Started: 2, Completed: 2}},
		{"after a load request, bytes that are no request lose the stream, not the connection", false,
			[]seg{in(0, get), out(0, ok5), in(uint32(len(get)), "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")},
			counts{Started: 1, Completed: 1}},
		{"a connection that began with a probe is classified request by request", false,
			[]seg{in(0, "GET /healthz HTTP/1.1\r\nUser-Agent: kube-probe/1.36\r\n\r\n"), out(0, ok5),
				in(54, "GET /healthz HTTP/1.1\r\nUser-Agent: kube-probe/1.36\r\n\r\n"), out(uint32(len(ok5)), ok5)},
			counts{Probes: 2}},
		{"a kube-probe look-alike is load", false,
			[]seg{in(0, "GET / HTTP/1.1\r\nUser-Agent: kube-prob/1\r\n\r\n")},
			counts{InFlight: 1, Started: 1}},
		{"proxied connection counts in both", true,
			[]seg{in(0, get), out(0, ok5), in(uint32(len(get)), get)},
			counts{InFlight: 1, Started: 2, Completed: 1, ProxiedInFlight: 1, ProxiedStarted: 2}},
		{"TLS is accounted at connection level", false,
			[]seg{in(0, "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"), out(0, "\x16\x03\x03\x00\x7a")},
			counts{InFlight: 1, Started: 1, OpaqueInFlight: 1, OpaqueTotal: 1}},
		{"an HTTP/2 preface: its streams are the requests (prog_h2_test.go), none yet", false,
			[]seg{in(0, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")},
			counts{}},
		{"an HTTP/2 preface cut short is not followed: connection level", false,
			[]seg{in(0, "PRI * HTTP/2.0\r\n"), in(16, "\r\nSM\r\n\r\n")},
			counts{InFlight: 1, Started: 1, OpaqueInFlight: 1, OpaqueTotal: 1}},
		{"a server that speaks first is not HTTP", false,
			[]seg{out(0, "220 smtp.example ESMTP\r\n"), in(0, "EHLO x\r\n")},
			counts{InFlight: 1, Started: 1, OpaqueInFlight: 1, OpaqueTotal: 1}},
		{"a malformed response falls back to connection level", false,
			[]seg{in(0, get), out(0, "HTTX/1.1 200 OK\r\n\r\n")},
			counts{InFlight: 1, Started: 1, OpaqueInFlight: 1, OpaqueTotal: 1}},
		{"pipelined requests count one by one", false,
			[]seg{in(0, get+get), out(0, ok5+ok5)},
			counts{Started: 2, Completed: 2}},
		{"five-digit Content-Length is read in words", false,
			[]seg{in(0, get), out(0, "HTTP/1.1 200 OK\r\nContent-Length: 10000\r\nX-Pad: 0123456789\r\n\r\n"), out(61, strings.Repeat("b", 2500)), out(2561, strings.Repeat("b", 2500)), out(5061, strings.Repeat("b", 2500)), out(7561, strings.Repeat("b", 2499))},
			counts{InFlight: 1, Started: 1}},
		{"five-digit Content-Length: the last byte completes it", false,
			[]seg{in(0, get), out(0, "HTTP/1.1 200 OK\r\nContent-Length: 10000\r\nX-Pad: 0123456789\r\n\r\n"), out(61, strings.Repeat("b", 2500)), out(2561, strings.Repeat("b", 2500)), out(5061, strings.Repeat("b", 2500)), out(7561, strings.Repeat("b", 2500))},
			counts{Started: 1, Completed: 1}},
		{"six-digit, spaced or bare Content-Length values take the byte path", false,
			[]seg{in(0, get), out(0, "HTTP/1.1 200 OK\r\nContent-Length: 000005\r\nX-Pad: 0123456789\r\n\r\nhello"),
				in(uint32(len(get)), get), out(67, "HTTP/1.1 200 OK\r\nContent-Length:  5 \r\nX-Pad: 0123456789\r\n\r\nhello"),
				in(uint32(2*len(get)), get), out(131, "HTTP/1.1 200 OK\r\nContent-Length:5\r\nX-Pad: 0123456789\r\n\r\nhello")},
			counts{Started: 3, Completed: 3}},
		{"tiny segments take the byte-by-byte path", false,
			[]seg{in(0, "GET / HTTP/1.1\r\n"), in(16, "\r\n"), out(0, "HTTP/1.1 200 OK\r\n"), out(17, "Content-Length: 2\r\n"), out(36, "\r\n"), out(38, "o"), out(39, "k")},
			counts{Started: 1, Completed: 1}},
	}
	for _, fam := range families(t) {
		t.Run(fam.name, func(t *testing.T) {
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					h := fam.harness(t)
					h.connect(1000, 5000, tt.proxied)
					for _, s := range tt.segs {
						if s.in {
							h.ingress(1000+s.off, s.data)
						} else {
							h.egress(5000+s.off, s.data)
						}
					}
					if diff := cmp.Diff(tt.want, h.counts()); diff != "" {
						t.Errorf("counts (-want +got):\n%s", diff)
					}
				})
			}
		})
	}
}

func TestProgLargeBodySkippedByCount(t *testing.T) {
	h := newProgHarness(t)
	h.ingress(1000, get)
	head := "HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n"
	h.egress(5000, head)
	body := make([]byte, 1400)
	for i := range body {
		body[i] = 'x'
	}
	seq := uint32(5000 + len(head))
	for sent := 0; sent < 1000000; sent += len(body) {
		n := min(len(body), 1000000-sent)
		if sent == 1400*10 {
			if got := h.counts(); got.Completed != 0 || got.InFlight != 1 {
				t.Fatalf("mid-body counts = %+v, want in flight", got)
			}
		}
		h.egress(seq, string(body[:n]))
		seq += uint32(n)
	}
	if diff := cmp.Diff(counts{Started: 1, Completed: 1}, h.counts()); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
}

func TestProgSequenceWraparound(t *testing.T) {
	h := newProgHarness(t)
	rx, tx := uint32(0xffffffff-10), uint32(0xffffffff-5)
	h.connect(rx, tx, false)
	h.ingress(rx, get)
	h.egress(tx, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
	h.ingress(rx+uint32(len(get)), get) // wraps past zero
	if diff := cmp.Diff(counts{InFlight: 1, Started: 2, Completed: 1}, h.counts()); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
}

func TestProgIPReuseIgnoresOldConnections(t *testing.T) {
	h := newProgHarness(t)
	h.ingress(1000, get)
	// The pod goes and another pod gets its slot (new id) before the old
	// connection's response: the new pod's counters stay untouched.
	if err := h.objs.PodCounters.Update(uint32(testSlot), &accountingPodStats{Id: testPodID + 1, Tenure: testTenure + 1}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	h.egress(5000, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
	if diff := cmp.Diff(counts{}, h.counts()); diff != "" {
		t.Errorf("counts (-want +got):\n%s", diff)
	}
}

func TestProgParseErrorIsCounted(t *testing.T) {
	h := newProgHarness(t)
	h.ingress(1000, get)
	h.egress(5000, "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n")
	var perCPU []uint64
	if err := h.objs.Events.Lookup(uint32(1+0), &perCPU); err != nil { // EV_PARSE_LIMIT
		t.Fatal(err)
	}
	var errs []uint64
	if err := h.objs.Events.Lookup(uint32(2), &errs); err != nil { // EV_PARSE_ERROR
		t.Fatal(err)
	}
	var total uint64
	for _, n := range errs {
		total += n
	}
	if total != 1 {
		t.Errorf("parse errors = %d, want 1", total)
	}
	if c := h.conn(); c.Opaque != 1 {
		t.Errorf("conn opaque = %d, want 1 after a parse error", c.Opaque)
	}
}
