package stack

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// SocketDest is the real remote address of conn, which getpeername does
// not show when the node's connect4 program rewrote the connect: its line
// in /proc/self/net/tcp, found by the socket's inode (a local port may be
// shared by connections to different destinations). The in-node clients
// of the end-to-end tests and of the demo read it.
func SocketDest(conn *net.TCPConn) (netip.AddrPort, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var st syscall.Stat_t
	var statErr error
	if err := raw.Control(func(fd uintptr) { statErr = syscall.Fstat(int(fd), &st) }); err != nil {
		return netip.AddrPort{}, err
	}
	if statErr != nil {
		return netip.AddrPort{}, statErr
	}
	b, err := os.ReadFile("/proc/self/net/tcp")
	if err != nil {
		return netip.AddrPort{}, err
	}
	return ProcTCPDest(b, st.Ino)
}

// ProcTCPDest finds the socket of inode in /proc/net/tcp's text and
// returns its remote address.
func ProcTCPDest(table []byte, inode uint64) (netip.AddrPort, error) {
	want := strconv.FormatUint(inode, 10)
	for _, line := range strings.Split(string(table), "\n")[1:] {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		f := strings.Fields(line)
		if len(f) >= 10 && f[9] == want {
			return procAddr(f[2])
		}
	}
	return netip.AddrPort{}, fmt.Errorf("socket inode %d not in /proc/self/net/tcp", inode)
}

// procAddr parses /proc/net/tcp's "0100007F:1F90": the IPv4 address as
// the kernel's __be32 printed in host order, the port in host order.
func procAddr(s string) (netip.AddrPort, error) {
	ipHex, portHex, ok := strings.Cut(s, ":")
	ip, err1 := strconv.ParseUint(ipHex, 16, 32)
	port, err2 := strconv.ParseUint(portHex, 16, 16)
	if !ok || err1 != nil || err2 != nil {
		return netip.AddrPort{}, fmt.Errorf("address %q in /proc/net/tcp", s)
	}
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], uint32(ip))
	return netip.AddrPortFrom(netip.AddrFrom4(b), uint16(port)), nil
}
