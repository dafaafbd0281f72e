package socktable

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"

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
// The kernel reads its tables bucket by bucket, so the answer is no
// snapshot of one instant: a connection opened or closed while it reads
// may be missing; nor is it in any particular order. Its cost is mostly
// the kernel's: it walks every bucket of the established-connections hash
// table, which all namespaces share unless
// net.ipv4.tcp_child_ehash_entries gave them one of their own, once for
// both families (twice on a kernel without the legacy request, see
// dumpLegacy; BenchmarkDump).
func Dump(ns Namespace, storageMapFDs []int) ([]Socket, error) {
	return dumpInStates(ns, storageMapFDs, dumpedStates)
}

// DumpServerSide is Dump of the sockets ServerConns looks at and no
// others: listeners, and connections in ESTABLISHED or CLOSE_WAIT (a
// server's, and the namespace's own outbound ones). ServerConns of its
// answer is ServerConns of Dump's. The kernel walks the same tables, but
// sends (and this package parses) nothing for connections being opened or
// closed, the server's side of those it has closed among them, nor for
// requests not yet accepted, which on a busy server can outnumber the
// open connections: each costs about as much as an open one (see
// BenchmarkDump's server-closed).
func DumpServerSide(ns Namespace, storageMapFDs []int) ([]Socket, error) {
	return dumpInStates(ns, storageMapFDs, serverSideStates)
}

// legacyRefused is set once the kernel has refused a legacy request that
// it then accepted as SOCK_DIAG_BY_FAMILY requests: it lacks the legacy
// request, and every later dump asks by family at once.
var legacyRefused atomic.Bool

// legacyRequestType is the legacy request's nlmsg_type, a variable so that
// a test can make it one the kernel does not know.
var legacyRequestType uint16 = tcpDiagGetSock

// dumpInStates lists the TCP sockets of ns in states (an idiag_states mask).
func dumpInStates(ns Namespace, storageMapFDs []int, states uint32) ([]Socket, error) {
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
	// The legacy request takes both families in one walk of the kernel's
	// tables (dumpLegacy); the requests by family, a walk each, are the
	// fallback for a kernel that refuses it: TCPDIAG_GETSOCK is kept for
	// tools older than SOCK_DIAG_BY_FAMILY, and a kernel may drop it.
	if legacyRefused.Load() {
		return dumpByFamily(ns, fd, states, storageMapFDs, buf)
	}
	socks, err := dumpLegacy(fd, states, storageMapFDs, buf)
	if err == nil {
		return socks, nil
	}
	if !legacyUnknown(err) {
		return nil, fmt.Errorf("dump sockets of %s: %w", ns, err)
	}
	// Refused as a kernel without the legacy request refuses it, but a
	// storage map fd that is no sk_storage is refused with EINVAL too:
	// only the same request accepted by family shows it was the request
	// type, and then the refusal is remembered.
	socks, err = dumpByFamily(ns, fd, states, storageMapFDs, buf)
	if err != nil {
		return nil, err
	}
	legacyRefused.Store(true)
	return socks, nil
}

// dumpLegacy dumps the TCP sockets of both families in states with one
// TCPDIAG_GETSOCK request, struct inet_diag_req, the request sock_diag
// keeps for the tools that predate SOCK_DIAG_BY_FAMILY. The kernel turns
// it into the SOCK_DIAG_BY_FAMILY request it would have been but with the
// family AF_UNSPEC (net/ipv4/inet_diag.c, inet_diag_dump_compat), which
// SOCK_DIAG_BY_FAMILY itself refuses (sock_diag picks its handler by the
// family), so TCP's dump takes the sockets of both families in one walk of
// each table (net/ipv4/tcp_diag.c, tcp_diag_dump); and it reads the
// request's attributes, INET_DIAG_REQ_SK_BPF_STORAGES among them, as it
// does SOCK_DIAG_BY_FAMILY's (both start with __inet_diag_dump_start since
// Linux 5.7, which added the storage attribute). Every socket is reported
// as SOCK_DIAG_BY_FAMILY would report it, but in a message of the
// request's type. It is preferred because it halves the walks, which are
// most of a dump's cost (BenchmarkDump's sockets=0 and by-family).
func dumpLegacy(fd int, states uint32, mapFDs []int, buf []byte) ([]Socket, error) {
	// idiag_family stays 0: the dump ignores it. A zero id matches every
	// socket; idiag_ext asks for no extension, idiag_dbs is unused.
	r := make(rawData, inetDiagReqLen)
	binary.NativeEndian.PutUint32(r[52:56], states)
	return dumpRequest(fd, legacyRequestType, r, mapFDs, buf, nil)
}

// legacyUnknown tells whether err is the refusal a kernel without the
// legacy request would answer it with: EINVAL from sock_diag for a type it
// does not handle, EOPNOTSUPP for TCPDIAG_GETSOCK without inet_diag's
// handler of it (net/core/sock_diag.c, sock_diag_rcv_msg).
func legacyUnknown(err error) bool {
	return errors.Is(err, errRefused) && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP))
}

// dumpByFamily dumps the TCP sockets in states with one SOCK_DIAG_BY_FAMILY
// request per family: sock_diag picks its handler by the request's
// family, and an AF_INET dump leaves out the IPv6 sockets (IPv4
// connections accepted on [::] among them).
func dumpByFamily(ns Namespace, fd int, states uint32, mapFDs []int, buf []byte) ([]Socket, error) {
	var socks []Socket
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		// struct inet_diag_req_v2; a zero id matches every socket.
		r := make(rawData, inetDiagReqV2Len)
		r[0] = family
		r[1] = unix.IPPROTO_TCP
		binary.NativeEndian.PutUint32(r[4:8], states)
		var err error
		socks, err = dumpRequest(fd, sockDiagByFamily, r, mapFDs, buf, socks)
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

// dumpRequest sends one sock_diag dump request of type typ with the
// request struct r and, with mapFDs, the attribute asking for the sockets'
// values in those sk_storage maps, and appends the answer's sockets to
// socks.
func dumpRequest(fd int, typ uint16, r rawData, mapFDs []int, buf []byte, socks []Socket) ([]Socket, error) {
	req := nl.NewNetlinkRequest(int(typ), unix.NLM_F_DUMP)
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
		socks, done, err = parseDump(buf[:n], req.Seq, typ, socks)
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
