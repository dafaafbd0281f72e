package drain

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sockscale/sockscale/agent/internal/socktable"
)

// Sockets finds a pod's server connections in its processes' file
// descriptors and duplicates them (pidfd_getfd), which needs the host's
// PID namespace and CAP_SYS_PTRACE (the agent's namespaceAccess).
type Sockets struct {
	// Finder finds the pod's network namespace; its ProcDir is where the
	// processes are looked for.
	Finder socktable.Finder
}

// ServerConns returns descriptors of the TCP connections accepted on pod's
// address by the processes of pod's network namespace, one per socket;
// the caller closes them. A process that exits meanwhile is skipped.
func (s Sockets) ServerConns(pod netip.Addr) ([]int, error) {
	nss, err := s.Finder.Find([]netip.Addr{pod})
	ns, ok := nss[pod]
	if !ok {
		if err != nil {
			return nil, fmt.Errorf("server connections of %s: %w", pod, err)
		}
		return nil, nil // no namespace holds the address any more: the pod's network is gone
	}
	procDir := s.Finder.ProcDir
	if procDir == "" {
		procDir = "/proc"
	}
	pids, err := os.ReadDir(procDir)
	if err != nil {
		return nil, fmt.Errorf("server connections of %s: %w", pod, err)
	}
	seen := map[uint64]bool{} // socket inodes: a forked server shares its sockets
	var fds []int
	for _, e := range pids {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(filepath.Join(procDir, e.Name(), "ns/net"), &st) != nil || st.Dev != ns.Dev || st.Ino != ns.Inode {
			continue
		}
		fds = append(fds, processConns(procDir, pid, pod, seen)...)
	}
	return fds, nil
}

// processConns duplicates the sockets of process pid that are connections
// accepted on pod's address and not in seen.
func processConns(procDir string, pid int, pod netip.Addr, seen map[uint64]bool) []int {
	dir := filepath.Join(procDir, strconv.Itoa(pid), "fd")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil // exited, or not ours to read
	}
	pidfd := -1
	defer func() {
		if pidfd >= 0 {
			_ = unix.Close(pidfd)
		}
	}()
	var fds []int
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		ino, ok := socketInode(target)
		if err != nil || !ok || seen[ino] {
			continue
		}
		seen[ino] = true
		num, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pidfd < 0 {
			if pidfd, err = unix.PidfdOpen(pid, 0); err != nil {
				return nil
			}
		}
		fd, err := unix.PidfdGetfd(pidfd, num, 0)
		if err != nil {
			continue // closed meanwhile
		}
		if acceptedOn(fd, pod) {
			fds = append(fds, fd)
		} else {
			_ = unix.Close(fd)
		}
	}
	return fds
}

// socketInode reads "socket:[12345]", a socket's /proc/PID/fd link.
func socketInode(link string) (uint64, bool) {
	rest, ok := strings.CutPrefix(link, "socket:[")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(strings.TrimSuffix(rest, "]"), 10, 64)
	return n, err == nil
}

// acceptedOn says whether fd is a TCP connection (no listener) whose local
// address is pod's: a server's, or the pod's own outbound one, which
// carries no state of ours and is left alone by the caller.
func acceptedOn(fd int, pod netip.Addr) bool {
	if typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || typ != unix.SOCK_STREAM {
		return false
	}
	if l, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || l != 0 {
		return false
	}
	if _, err := unix.Getpeername(fd); err != nil {
		return false
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return false
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrFrom4(a.Addr) == pod
	case *unix.SockaddrInet6:
		return netip.AddrFrom16(a.Addr).Unmap() == pod
	}
	return false
}

// Cookie, unsent bytes and closing our side, on a duplicated descriptor.

func cookieOf(fd int) (uint64, error) {
	return unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
}

func unsentBytes(fd int) (int, error) {
	return unix.IoctlGetInt(fd, unix.SIOCOUTQNSD)
}

// closeWrite sends a FIN: the client sees the end of an idle connection
// and closes it; the server's process keeps its descriptor until it reads
// the client's end.
func closeWrite(fd int) error {
	err := unix.Shutdown(fd, unix.SHUT_WR)
	if errors.Is(err, unix.ENOTCONN) {
		return nil // closed meanwhile
	}
	return err
}

func closeFD(fd int) { _ = unix.Close(fd) }
