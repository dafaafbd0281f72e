package socktable

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
)

// Address families as Socket.Family reports them (AF_INET and AF_INET6 on
// Linux), named here so the package builds on every platform.
const (
	FamilyIPv4 = 2
	FamilyIPv6 = 10
)

// State is a TCP state as the kernel numbers them (include/net/tcp_states.h).
type State uint8

// The TCP states. NewSynRecv and BoundInactive are never the state of a
// connection: the first is a request the kernel has not made a socket of
// yet (sock_diag reports those as SynRecv), the second a pseudo-state
// sock_diag gives sockets bound but neither listening nor connected.
const (
	Established State = 1 + iota
	SynSent
	SynRecv
	FinWait1
	FinWait2
	TimeWait
	Close
	CloseWait
	LastAck
	Listen
	Closing
	NewSynRecv
	BoundInactive
)

var stateNames = [...]string{
	Established:   "ESTABLISHED",
	SynSent:       "SYN_SENT",
	SynRecv:       "SYN_RECV",
	FinWait1:      "FIN_WAIT1",
	FinWait2:      "FIN_WAIT2",
	TimeWait:      "TIME_WAIT",
	Close:         "CLOSE",
	CloseWait:     "CLOSE_WAIT",
	LastAck:       "LAST_ACK",
	Listen:        "LISTEN",
	Closing:       "CLOSING",
	NewSynRecv:    "NEW_SYN_RECV",
	BoundInactive: "BOUND_INACTIVE",
}

func (s State) String() string {
	if int(s) < len(stateNames) && stateNames[s] != "" {
		return stateNames[s]
	}
	return "STATE(" + strconv.Itoa(int(s)) + ")"
}

// dumpedStates is the idiag_states mask Dump asks for: every state but
// TIME_WAIT (no socket, nothing open: the kernel keeps only a small
// timewait record) and the two that are no connection (NEW_SYN_RECV,
// BOUND_INACTIVE: asking for the latter would also walk the bind table).
// The kernel adds NEW_SYN_RECV by itself whenever SYN_RECV is asked for and
// reports those requests as SYN_RECV, so they can still appear; they are
// never server connections.
const dumpedStates uint32 = (1<<(Closing+1) - 1) &^ (1 << TimeWait) &^ 1

// serverSideStates is the idiag_states mask DumpServerSide asks for: the
// states ServerConns looks at. Without SYN_RECV the kernel adds no
// NEW_SYN_RECV either.
const serverSideStates uint32 = 1<<Established | 1<<CloseWait | 1<<Listen

// Socket is one TCP socket of a namespace as sock_diag reports it.
type Socket struct {
	// Family is the socket's own address family (FamilyIPv4 or
	// FamilyIPv6): an IPv4 connection accepted by a listener on [::] is an
	// IPv6 socket although Local and Remote are IPv4 addresses.
	Family uint8
	State  State
	// Local and Remote, with IPv4-mapped IPv6 addresses unmapped to IPv4.
	// Remote is the zero port on the unspecified address for a listener.
	Local, Remote netip.AddrPort
	// Cookie is the socket's cookie: the value bpf_get_socket_cookie
	// returns for it in a BPF program, and getsockopt SO_COOKIE in user
	// space. Unique for the life of the machine, never 0.
	Cookie uint64
	// Inode is the socket's inode number, 0 when no file refers to it (not
	// yet accepted, or closed by its process while the kernel finishes it).
	Inode uint32
	// UID owns the socket.
	UID uint32
	// V6Only is IPV6_V6ONLY of an IPv6 socket in LISTEN or CLOSE, which is
	// when the kernel reports it; false otherwise.
	V6Only bool
	// Storage holds, per BPF map ID, this socket's value in each
	// BPF_MAP_TYPE_SK_STORAGE map Dump was given; nil when it has none.
	Storage map[uint32][]byte
}

// ServerConns returns, in their order, the sockets that are connections a
// server of the namespace accepted and has not closed: in ESTABLISHED or
// CLOSE_WAIT (the client may have closed its side; the server has not), on
// a local port something listens on in socks, on the connection's local
// address or on a wildcard address. An IPv4 connection is covered by a
// listener on 0.0.0.0 and by one on [::] unless the kernel reported that
// listener IPV6_V6ONLY (it does for every IPv6 listener; a listener
// without the report is taken to accept IPv4 too, Linux's default). The
// namespace's own outbound connections have ephemeral local ports nothing
// listens on, so they are left out; so are connections whose listener has
// closed (a server shutting down), which no longer count as the server's.
func ServerConns(socks []Socket) []Socket {
	type key struct {
		addr netip.Addr
		port uint16
	}
	listening := make(map[key]bool)
	// listenV4Wild and listenV6Wild are the ports with a listener on
	// 0.0.0.0 and on [::] (the latter also taking IPv4 unless v6-only).
	listenV4Wild := make(map[uint16]bool)
	listenV6Wild := make(map[uint16]bool)
	listenV6WildV4 := make(map[uint16]bool)
	for _, s := range socks {
		if s.State != Listen {
			continue
		}
		a, p := s.Local.Addr(), s.Local.Port()
		switch {
		case a == netip.IPv4Unspecified():
			listenV4Wild[p] = true
		case a == netip.IPv6Unspecified():
			listenV6Wild[p] = true
			if !s.V6Only {
				listenV6WildV4[p] = true
			}
		default:
			listening[key{a, p}] = true
		}
	}
	served := func(s *Socket) bool {
		if s.State != Established && s.State != CloseWait {
			return false
		}
		a, p := s.Local.Addr(), s.Local.Port()
		if listening[key{a, p}] {
			return true
		}
		if a.Is4() {
			return listenV4Wild[p] || listenV6WildV4[p]
		}
		return listenV6Wild[p]
	}
	// Counted first: a Socket is about 100 bytes, and growing the slice of
	// 10,000 by append allocated five times what it holds.
	n := 0
	for i := range socks {
		if served(&socks[i]) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	conns := make([]Socket, 0, n)
	for i := range socks {
		if served(&socks[i]) {
			conns = append(conns, socks[i])
		}
	}
	return conns
}

// ErrNamespaceGone is returned when a Namespace's path no longer leads to
// that namespace: the process it was found through has exited (its PID
// possibly reused) or the name was deleted. Find it again.
var ErrNamespaceGone = errors.New("network namespace no longer at its path")

// Namespace is one network namespace, identified by its nsfs device and
// inode (what stat of any of its paths says), with a path to open it by.
type Namespace struct {
	// Path opens the namespace: a name under the netns directory (stable)
	// or /proc/PID/ns/net of a process in it (valid while that process
	// lives, so Open checks the inode).
	Path string
	// Dev and Inode identify the namespace for as long as it exists.
	Dev, Inode uint64
}

func (n Namespace) String() string {
	return fmt.Sprintf("netns %d (%s)", n.Inode, n.Path)
}

// Finder finds pods' network namespaces. The zero value looks where a
// process of the host does; an agent in a container with the host's /proc
// and /var/run/netns mounted elsewhere says where.
type Finder struct {
	// ProcDir is the host's /proc ("/proc" when empty): every process's
	// namespace is at ProcDir/PID/ns/net.
	ProcDir string
	// NetnsDir holds named namespaces as ip-netns and container runtimes
	// bind-mount them ("/var/run/netns" when empty). Their paths stay
	// valid for the namespace's life, so they are preferred.
	NetnsDir string
}

// FindNamespaces is Finder{}.Find: the namespaces of want as seen from the
// host's /proc and /var/run/netns.
func FindNamespaces(want []netip.Addr) (map[netip.Addr]Namespace, error) {
	return Finder{}.Find(want)
}
