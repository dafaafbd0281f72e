package socktable

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// recvBufSize holds any datagram of a dump: the kernel fills at most 32 KiB
// per datagram (netlink_recvmsg caps what it allocates for dumps there).
const recvBufSize = 64 << 10

// Dump lists the TCP sockets, IPv4 and IPv6, of the namespace ns in every
// state but TIME_WAIT; connections the kernel has not made a socket of yet
// (NEW_SYN_RECV requests) come as SYN_RECV without an inode. With
// storageMapFDs, file descriptors of BPF_MAP_TYPE_SK_STORAGE maps, each
// socket's values in those maps come along in its Storage, keyed by the
// maps' IDs. It needs CAP_SYS_ADMIN (to enter the namespace), and CAP_BPF
// or CAP_SYS_ADMIN for the storage. The calling goroutine's namespace is
// never changed: the netlink socket is made in the namespace by a
// goroutine of its own.
//
// The kernel reads its table bucket by bucket, each family in turn, so the
// answer is no snapshot of one instant: a connection opened or closed
// while it reads may be missing. Its cost is mostly the kernel's: it walks
// every bucket of the established-connections hash table, which all
// namespaces share unless net.ipv4.tcp_child_ehash_entries gave them one of
// their own, once per family (see BenchmarkDump).
func Dump(ns Namespace, storageMapFDs []int) ([]Socket, error) {
	h, err := ns.Open()
	if err != nil {
		return nil, fmt.Errorf("dump sockets: %w", err)
	}
	fd, err := netlinkSocketIn(h, unix.NETLINK_SOCK_DIAG)
	closeFD(int(h))
	if err != nil {
		return nil, fmt.Errorf("dump sockets of %s: %w", ns, err)
	}
	defer closeFD(fd)
	// The kernel never leaves a dump waiting; this only bounds a bug.
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 10}); err != nil {
		return nil, fmt.Errorf("dump sockets of %s: receive timeout: %w", ns, err)
	}

	buf := make([]byte, recvBufSize)
	var socks []Socket
	// One dump per family: sock_diag picks its handler by the request's
	// family, and an AF_INET dump leaves out the IPv6 sockets (IPv4
	// connections accepted on [::] among them).
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		socks, err = dumpFamily(fd, family, storageMapFDs, buf, socks)
		if err != nil {
			return nil, fmt.Errorf("dump %s sockets of %s: %w", familyName(family), ns, err)
		}
	}
	return socks, nil
}

func familyName(f uint8) string {
	if f == unix.AF_INET {
		return "IPv4"
	}
	return "IPv6"
}

// dumpFamily sends one SOCK_DIAG_BY_FAMILY dump request for TCP sockets of
// family and appends the answer's sockets to socks.
func dumpFamily(fd int, family uint8, mapFDs []int, buf []byte, socks []Socket) ([]Socket, error) {
	req := nl.NewNetlinkRequest(sockDiagByFamily, unix.NLM_F_DUMP)
	// struct inet_diag_req_v2; a zero id matches every socket.
	r := make(rawData, inetDiagReqV2Len)
	r[0] = family
	r[1] = unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(r[4:8], dumpedStates)
	req.AddData(r)
	if len(mapFDs) > 0 {
		stores := nl.NewRtAttr(reqSkBPFStorages|unix.NLA_F_NESTED, nil)
		for _, m := range mapFDs {
			stores.AddRtAttr(storageReqMapFD, nl.Uint32Attr(uint32(m)))
		}
		req.AddData(stores)
	}
	if err := unix.Sendto(fd, req.Serialize(), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return socks, fmt.Errorf("send request: %w", err)
	}
	for {
		n, _, flags, _, err := unix.Recvmsg(fd, buf, nil, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.EAGAIN) {
			return socks, fmt.Errorf("receive: no answer in time: %w", err)
		}
		if err != nil {
			return socks, fmt.Errorf("receive: %w", err)
		}
		if flags&unix.MSG_TRUNC != 0 {
			return socks, fmt.Errorf("receive: a datagram larger than %d bytes was cut", len(buf))
		}
		if n == 0 {
			return socks, malformed("empty datagram before NLMSG_DONE")
		}
		var done bool
		socks, done, err = parseDump(buf[:n], req.Seq, sockDiagByFamily, socks)
		if err != nil {
			return socks, err
		}
		if done {
			return socks, nil
		}
	}
}

// rawData is request data serialized as it is (nl's NetlinkRequestData).
type rawData []byte

func (d rawData) Len() int          { return len(d) }
func (d rawData) Serialize() []byte { return d }

// netlinkSocketIn makes a netlink socket of protocol proto in the
// namespace ns. A socket stays in the namespace it was made in, so only
// its creation needs the thread in ns; that happens on a thread locked by
// a goroutine of its own, which the caller's goroutine never runs on.
func netlinkSocketIn(ns netns.NsHandle, proto int) (int, error) {
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		fd, restored, err := socketInLocked(ns, proto)
		done <- result{fd, err}
		// A thread left in the other namespace must not run any other
		// goroutine: a goroutine that exits locked takes its thread along.
		if restored {
			runtime.UnlockOSThread()
		}
	}()
	r := <-done
	return r.fd, r.err
}

// socketInLocked does netlinkSocketIn's work on a locked thread; restored
// tells whether the thread is back in its namespace.
func socketInLocked(ns netns.NsHandle, proto int) (fd int, restored bool, err error) {
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, true, fmt.Errorf("open this thread's network namespace: %w", err)
	}
	defer closeFD(orig)
	if err := unix.Setns(int(ns), unix.CLONE_NEWNET); err != nil {
		return -1, true, fmt.Errorf("enter the namespace: %w", err)
	}
	fd, sockErr := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
		if sockErr == nil {
			closeFD(fd)
		}
		return -1, false, fmt.Errorf("return to our own namespace: %w", err)
	}
	if sockErr != nil {
		return -1, true, fmt.Errorf("netlink socket: %w", sockErr)
	}
	return fd, true, nil
}
