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
	table := "/proc/self/net/tcp"
	if a, ok := conn.LocalAddr().(*net.TCPAddr); ok && a.IP.To4() == nil {
		table = "/proc/self/net/tcp6" // an IPv6 socket (not IPv4-mapped) is listed there
	}
	b, err := os.ReadFile(table)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return ProcTCPDest(b, st.Ino)
}

// ProcTCPDest finds the socket of inode in /proc/net/tcp's (or tcp6's)
// text and returns its remote address.
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
// the kernel's __be32 printed in host order, the port in host order; or
// /proc/net/tcp6's 32 hex digits, the IPv6 address as four such words.
func procAddr(s string) (netip.AddrPort, error) {
	ipHex, portHex, ok := strings.Cut(s, ":")
	port, err := strconv.ParseUint(portHex, 16, 16)
	if !ok || err != nil || (len(ipHex) != 8 && len(ipHex) != 32) {
		return netip.AddrPort{}, fmt.Errorf("address %q in /proc/net/tcp", s)
	}
	b := make([]byte, 0, 16)
	for i := 0; i < len(ipHex); i += 8 {
		w, err := strconv.ParseUint(ipHex[i:i+8], 16, 32)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("address %q in /proc/net/tcp", s)
		}
		b = binary.NativeEndian.AppendUint32(b, uint32(w))
	}
	ip, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(ip, uint16(port)), nil
}
