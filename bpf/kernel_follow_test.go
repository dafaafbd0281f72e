//go:build linux

package bpf

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/textproto"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// The real-kernel tests of this file follow requests on real sockets in a
// test pod's network namespace, through a small HTTP/1.1 server of their
// own (followServerMain): Go's server closes a connection after an early
// response to Expect: 100-continue, and its listener options are fixed.

// followServerEnv, when set to "port[,option...]", makes the test binary
// the follow server: it waits to be released into its cgroup (a line on
// stdin), listens on port and serves until killed. Options: defer
// (TCP_DEFER_ACCEPT), fastopen (TCP_FASTOPEN, no cookie needed).
const followServerEnv = "SOCKSCALE_BPF_FOLLOW_SERVER"

const followPort = 8081

// followServerMain serves HTTP/1.1 as nginx and most servers do where Go's
// server does not: it ignores empty lines before a request line (RFC 9112
// section 2.2), answers pipelined requests in order, and answers a request
// to /early that expects 100-continue at once with 413, reads its body
// anyway and keeps the connection. Other requests get 200 with ?size=N
// bytes (default 2) after ?sleep=D. It returns unless this process is the
// server.
func followServerMain() {
	arg := os.Getenv(followServerEnv)
	if arg == "" {
		return
	}
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // released into the cgroup
	opts := strings.Split(arg, ",")
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			for _, o := range opts[1:] {
				switch o {
				case "defer":
					serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, 10)
				case "fastopen":
					serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_FASTOPEN, 64)
					if serr == nil {
						serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_FASTOPEN_NO_COOKIE, 1)
					}
				}
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
	l, err := lc.Listen(context.Background(), "tcp", ":"+opts[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "follow server:", err)
		os.Exit(1)
	}
	for {
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, "follow server:", err)
			os.Exit(1)
		}
		go serveFollow(c)
	}
}

func serveFollow(c net.Conn) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 64<<10)
	tp := textproto.NewReader(br)
	for {
		line, err := tp.ReadLine()
		if err != nil {
			return
		}
		if line == "" {
			continue // RFC 9112 section 2.2
		}
		method, rest, _ := strings.Cut(line, " ")
		target, _, _ := strings.Cut(rest, " ")
		hdr, err := tp.ReadMIMEHeader()
		if err != nil {
			return
		}
		u, err := url.Parse(target)
		if err != nil {
			return
		}
		var body io.Reader = http.NoBody
		if strings.EqualFold(hdr.Get("Transfer-Encoding"), "chunked") {
			body = httputil.NewChunkedReader(br)
		} else if n, err := strconv.ParseInt(hdr.Get("Content-Length"), 10, 64); err == nil {
			body = io.LimitReader(br, n)
		}
		if u.Path == "/early" && strings.EqualFold(hdr.Get("Expect"), "100-continue") {
			if _, err := io.WriteString(c, "HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\n\r\n"); err != nil {
				return
			}
		}
		if _, err := io.Copy(io.Discard, body); err != nil {
			return
		}
		if u.Path == "/early" {
			continue // answered before its body
		}
		if d, err := time.ParseDuration(u.Query().Get("sleep")); err == nil {
			time.Sleep(d)
		}
		size := 2
		if n, err := strconv.Atoi(u.Query().Get("size")); err == nil {
			size = n
		}
		var resp bytes.Buffer
		fmt.Fprintf(&resp, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", size)
		if method != http.MethodHead {
			resp.Write(bytes.Repeat([]byte("b"), size))
		}
		if _, err := c.Write(resp.Bytes()); err != nil {
			return
		}
	}
}

// startFollowServer runs the follow server in e's pod, in the pod's cgroup.
func startFollowServer(t *testing.T, e *kernelEnv, options ...string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", e.pod.Name, self)
	cmd.Env = append(os.Environ(), followServerEnv+"="+strings.Join(append([]string{strconv.Itoa(followPort)}, options...), ","))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	gate, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e.pod.Adopt(cmd)
	// ip netns exec execs the binary in place: this pid is the server.
	if err := os.WriteFile(filepath.Join(e.pod.Cgroup, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(gate, "go\n"); err != nil {
		t.Fatal(err)
	}
	if err := e.pod.WaitListening(followPort, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// followConn is a client connection to the follow server.
type followConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialFollow(t *testing.T, e *kernelEnv) *followConn {
	t.Helper()
	c, err := net.Dial("tcp", e.pod.Addr(followPort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &followConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (f *followConn) write(s string) {
	f.t.Helper()
	if _, err := io.WriteString(f.c, s); err != nil {
		f.t.Fatal(err)
	}
}

// read reads n responses to requests that are not HEAD.
func (f *followConn) read(n int) {
	f.t.Helper()
	_ = f.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	for range n {
		resp, err := http.ReadResponse(f.br, nil)
		if err != nil {
			f.t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			f.t.Fatal(err)
		}
		resp.Body.Close()
	}
}

func followGet(query string) string {
	return "GET /?" + query + " HTTP/1.1\r\nHost: pod\r\nUser-Agent: follow/1\r\n\r\n"
}

// waitFollowed waits until the pod's counters show requests started and
// completed, none in flight and no connection at connection level, and
// the kernel side met none of its limits and lost no stream.
func (e *kernelEnv) waitFollowed(t *testing.T, requests uint64) PodCounters {
	t.Helper()
	return e.waitFollowedWith(t, requests, Events{})
}

// waitFollowedWith is waitFollowed where the kernel's events must be want.
func (e *kernelEnv) waitFollowedWith(t *testing.T, requests uint64, want Events) PodCounters {
	t.Helper()
	got := e.waitCounters(t, fmt.Sprintf("%d requests followed", requests), func(c PodCounters) bool {
		return c.Requests.Started == requests && c.Requests.Completed == requests && c.Requests.InFlight == 0 && c.OpaqueConnsTotal == 0
	})
	ev, err := e.acct.Events()
	if err != nil {
		t.Fatal(err)
	}
	if ev != want {
		t.Errorf("events = %+v, want %+v", ev, want)
	}
	return got
}

func TestKernelPipelinedRequests(t *testing.T) {
	e := newKernelEnv(t, "")
	startFollowServer(t, e)
	f := dialFollow(t, e)
	// Three requests in one write; the server takes 200 ms over each, in
	// turn, so they are in flight for 200, 400 and 600 ms.
	r := followGet("sleep=200ms")
	start := time.Now()
	f.write(r + r + r)
	got := e.waitCounters(t, "three requests in flight", func(c PodCounters) bool { return c.Requests.InFlight >= 3 })
	if got.Requests.Started != 3 {
		t.Errorf("started = %d, want 3", got.Requests.Started)
	}
	f.read(3)
	took := time.Since(start)
	got = e.waitFollowed(t, 3)
	// 1.2 s of request time, less what the client spent outside the server.
	if area := got.Requests.Area; area < 1100*time.Millisecond || area > 1200*time.Millisecond+3*(took-600*time.Millisecond) {
		t.Errorf("request time %v, want the three requests' 1.2 s", area)
	}
}

func TestKernelStrayCRLF(t *testing.T) {
	e := newKernelEnv(t, "")
	startFollowServer(t, e)
	f := dialFollow(t, e)
	// Old clients end a POST body with an extra CRLF (RFC 9112 section 2.2).
	f.write("POST /?x=1 HTTP/1.1\r\nHost: pod\r\nContent-Length: 4\r\n\r\nbody\r\n")
	f.read(1)
	for range 5 {
		f.write(followGet("") + "\r\n")
		f.read(1)
	}
	f.write("\r\n")
	time.Sleep(50 * time.Millisecond) // a segment of its own
	f.write(followGet(""))
	f.read(1)
	e.waitFollowed(t, 7)
}

func TestKernelEarlyResponse(t *testing.T) {
	e := newKernelEnv(t, "")
	startFollowServer(t, e)
	f := dialFollow(t, e)
	// The server answers 413 before the body; the client sends it anyway
	// (it did not wait for 100 Continue), then keeps the connection.
	f.write("POST /early HTTP/1.1\r\nHost: pod\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n")
	f.read(1)
	f.write(strings.Repeat("x", 100))
	for range 5 {
		f.write(followGet(""))
		f.read(1)
	}
	e.waitFollowed(t, 6)
}

// TestKernelDeferAccept: with TCP_DEFER_ACCEPT (nginx's "deferred") the
// connection is established by the segment that carries the first
// request, which reaches the listening socket.
func TestKernelDeferAccept(t *testing.T) {
	inFamilies(t, testDeferAccept)
}

func testDeferAccept(t *testing.T, ipv6 bool) {
	e := newFamilyEnv(t, "", ipv6)
	startFollowServer(t, e, "defer")
	base, _ := e.counters(t)
	const conns, sleep = 5, 100 * time.Millisecond
	for range conns {
		f := dialFollow(t, e)
		for range 2 {
			f.write(followGet("sleep=" + sleep.String()))
			f.read(1)
		}
		f.c.Close()
	}
	got := e.waitFollowed(t, 2*conns)
	if area := got.Requests.Area - base.Requests.Area; area < 2*conns*sleep {
		t.Errorf("request time %v, want at least the server's %v", area, 2*conns*sleep)
	}
}

// TestKernelFastOpen: the first request comes in the SYN.
func TestKernelFastOpen(t *testing.T) {
	e := newKernelEnv(t, "")
	if out, err := exec.Command("ip", "netns", "exec", e.pod.Name, "sysctl", "-qw", "net.ipv4.tcp_fastopen=3").CombinedOutput(); err != nil {
		t.Fatalf("enable TCP Fast Open in the pod: %v: %s", err, out)
	}
	startFollowServer(t, e, "fastopen")
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_FASTOPEN_CONNECT, 1)
			if serr == nil {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_FASTOPEN_NO_COOKIE, 1)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
	const conns = 3
	for range conns {
		c, err := d.Dial("tcp", e.pod.Addr(followPort))
		if err != nil {
			t.Fatal(err)
		}
		f := &followConn{t: t, c: c, br: bufio.NewReader(c)}
		for range 2 {
			f.write(followGet("sleep=20ms"))
			f.read(1)
		}
		info, err := tcpInfo(c)
		if err != nil {
			t.Fatal(err)
		}
		if info.Options&tcpiOptSynData == 0 {
			t.Fatalf("the first request did not go in the SYN (tcpi_options %#x): TCP Fast Open is not what this test runs", info.Options)
		}
		c.Close()
	}
	e.waitFollowed(t, 2*conns)
}

func tcpInfo(c net.Conn) (*unix.TCPInfo, error) {
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return nil, err
	}
	var info *unix.TCPInfo
	var ierr error
	if err := rc.Control(func(fd uintptr) { info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
		return nil, err
	}
	return info, ierr
}

// dropper loses chosen segments on their way to a test pod (testdrop.c).
type dropper struct {
	rules *ebpf.Map
}

// newDropper attaches the test object's drop program to the pod's end of
// its link, where segments arrive: a segment dropped there is lost on the
// wire as far as the sender knows. (Dropped on the host's end it would not
// be: TCP learns that its transmit failed and sends it again at once.)
func newDropper(t *testing.T, e *kernelEnv) *dropper {
	t.Helper()
	spec, err := loadAccountingtest()
	if err != nil {
		t.Fatal(err)
	}
	var objs struct {
		Prog  *ebpf.Program `ebpf:"sockscale_test_drop"`
		Rules *ebpf.Map     `ebpf:"drop_rules"`
	}
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.Prog.Close(); objs.Rules.Close() })
	inNetns(t, e.pod.Name, func() error {
		ifc, err := onlyLink()
		if err != nil {
			return err
		}
		l, err := link.AttachTCX(link.TCXOptions{Interface: ifc.Index, Program: objs.Prog, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return fmt.Errorf("attach the drop program to %s: %w", ifc.Name, err)
		}
		t.Cleanup(func() { l.Close() })
		return nil
	})
	return &dropper{rules: objs.Rules}
}

// inNetns runs fn in network namespace netns (ip netns) on a thread of its
// own, which it never gives back to Go's scheduler.
func inNetns(t *testing.T, netns string, fn func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // the thread exits with the goroutine
		errc <- func() error {
			fd, err := unix.Open("/run/netns/"+netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("enter network namespace %s: %w", netns, err)
			}
			return fn()
		}()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// onlyLink is the one link of this network namespace besides lo.
func onlyLink() (net.Interface, error) {
	ifcs, err := net.Interfaces()
	if err != nil {
		return net.Interface{}, err
	}
	for _, ifc := range ifcs {
		if ifc.Flags&net.FlagLoopback == 0 {
			return ifc, nil
		}
	}
	return net.Interface{}, fmt.Errorf("no link but lo")
}

// drop loses the next count segments to port with payload bytes (0: bare ACKs).
func (d *dropper) drop(t *testing.T, port, payload uint16, count uint32) {
	t.Helper()
	if err := d.rules.Update(uint32(0), accountingtestDropRule{Port: port, Payload: payload, Count: count}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
}

// left is how many of the segments to drop have not been seen.
func (d *dropper) left(t *testing.T) uint32 {
	t.Helper()
	var r accountingtestDropRule
	if err := d.rules.Lookup(uint32(0), &r); err != nil {
		t.Fatal(err)
	}
	return r.Count
}

// hostLink is the host's interface with address ip: a test pod's link.
func hostLink(t *testing.T, ip netip.Addr) net.Interface {
	t.Helper()
	ifcs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, ifc := range ifcs {
		addrs, err := ifc.Addrs()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr() == ip {
				return ifc
			}
		}
	}
	t.Fatalf("no interface has %s", ip)
	return net.Interface{}
}

// TestKernelLostHandshakeACK: the client's ACK that completes the
// handshake is lost, so its first request completes it.
func TestKernelLostHandshakeACK(t *testing.T) {
	e := newKernelEnv(t, "")
	startFollowServer(t, e)
	d := newDropper(t, e)
	d.drop(t, followPort, 0, 1)
	f := dialFollow(t, e)
	for range 3 {
		f.write(followGet(""))
		f.read(1)
	}
	if n := d.left(t); n != 0 {
		t.Fatalf("the handshake's ACK was not dropped (%d left)", n)
	}
	e.waitFollowed(t, 3)
}

// TestKernelReorderedFirstSegment: the first segment of a request is lost,
// so the second reaches the pod first and the first comes again later.
func TestKernelReorderedFirstSegment(t *testing.T) {
	e := newKernelEnv(t, "")
	startFollowServer(t, e)
	d := newDropper(t, e)
	for i, split := range []struct {
		first, second string
		events        Events // since the start
	}{
		// Headers split: the parser cannot know what it missed, so it
		// loses the stream and finds it again at the next request.
		{"GET /?a=1 HTTP/1.1\r\nHost: pod\r\nX-Pad: " + strings.Repeat("p", 300), "\r\nUser-Agent: follow/1\r\n\r\n",
			Events{StreamGap: 1, Resync: 1}},
		// Inside a body: what it missed is skipped by count.
		{"POST /?b=1 HTTP/1.1\r\nHost: pod\r\nContent-Length: 600\r\n\r\n" + strings.Repeat("q", 300), strings.Repeat("q", 300),
			Events{StreamGap: 1, Resync: 1}},
	} {
		f := dialFollow(t, e)
		f.write(followGet(""))
		f.read(1)
		d.drop(t, followPort, uint16(len(split.first)), 1)
		// Two segments (Go sets TCP_NODELAY), the second sent before the
		// first is retransmitted (a tail loss probe waits for an RTT or two).
		f.write(split.first)
		f.write(split.second)
		f.read(1)
		if n := d.left(t); n != 0 {
			t.Fatalf("split %d: the first segment was not dropped", i)
		}
		for range 3 {
			f.write(followGet(""))
			f.read(1)
		}
		f.c.Close()
		e.waitFollowedWith(t, uint64(5*(i+1)), split.events)
	}
}

// TestKernelBigTCP: segments over 64 KiB (IPv4 BIG TCP) in both directions
// while body bytes are skipped.
func TestKernelBigTCP(t *testing.T) {
	e := newKernelEnv(t, "")
	startFollowServer(t, e)
	const size = 256 << 10
	// The pod sends responses, the host requests: both ends' links.
	setGSOMaxSize(t, e, size)
	f := dialFollow(t, e)
	body := strings.Repeat("u", 4<<20)
	for range 3 {
		f.write(followGet("size=4000000"))
		f.read(1)
		f.write("POST /?size=10 HTTP/1.1\r\nHost: pod\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
		f.read(1)
	}
	e.waitFollowed(t, 6)
}

// setGSOMaxSize sets the largest GSO packet, IPv4 included (BIG TCP), of
// the host's link to the pod and of the pod's own.
func setGSOMaxSize(t *testing.T, e *kernelEnv, size uint32) {
	t.Helper()
	attrs := map[uint16]uint32{unix.IFLA_GSO_MAX_SIZE: size, unix.IFLA_GSO_IPV4_MAX_SIZE: size}
	if err := setLinkU32(hostLink(t, e.pod.HostIP).Index, attrs); err != nil {
		t.Fatalf("set the host link's GSO max size (iproute2 6.1 cannot): %v", err)
	}
	inNetns(t, e.pod.Name, func() error {
		ifc, err := onlyLink()
		if err != nil {
			return err
		}
		if err := setLinkU32(ifc.Index, attrs); err != nil {
			return fmt.Errorf("set the pod link's GSO max size: %w", err)
		}
		return nil
	})
}

// setLinkU32 sets u32 attributes of a link through rtnetlink.
func setLinkU32(index int, attrs map[uint16]uint32) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	msg := make([]byte, unix.SizeofNlMsghdr+unix.SizeofIfInfomsg)
	binary.NativeEndian.PutUint16(msg[4:], unix.RTM_NEWLINK)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint32(msg[8:], 1) // sequence number
	binary.NativeEndian.PutUint32(msg[unix.SizeofNlMsghdr+4:], uint32(index))
	for typ, v := range attrs {
		a := make([]byte, 8)
		binary.NativeEndian.PutUint16(a[0:], 8)
		binary.NativeEndian.PutUint16(a[2:], typ)
		binary.NativeEndian.PutUint32(a[4:], v)
		msg = append(msg, a...)
	}
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return err
	}
	if n < unix.SizeofNlMsghdr+4 || binary.NativeEndian.Uint16(buf[4:]) != unix.NLMSG_ERROR {
		return fmt.Errorf("unexpected netlink answer")
	}
	if errno := int32(binary.NativeEndian.Uint32(buf[unix.SizeofNlMsghdr:])); errno != 0 {
		return fmt.Errorf("rtnetlink: %w", syscall.Errno(-errno))
	}
	return nil
}

// tcpiOptSynData is TCPI_OPT_SYN_DATA of linux/tcp.h: the SYN carried data
// that the peer acknowledged.
const tcpiOptSynData = 32
