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
// the caller closes them. A process that exits meanwhile is skipped; one
// whose descriptors cannot be read (the agent lacks a capability, a
// security module says no) makes the error, which names it, while the
// descriptors of the others are returned.
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
	var errs []error
	for _, e := range pids {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Stat(filepath.Join(procDir, e.Name(), "ns/net"), &st) != nil || st.Dev != ns.Dev || st.Ino != ns.Inode {
			continue
		}
		got, err := processConns(procDir, pid, pod, seen)
		fds = append(fds, got...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fds, fmt.Errorf("server connections of %s: %w", pod, errors.Join(errs...))
	}
	return fds, nil
}

// exited says that err is a process's or descriptor's going away, not a
// refusal.
func exited(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) || errors.Is(err, unix.EBADF)
}

// processConns duplicates the sockets of process pid that are connections
// accepted on pod's address and not in seen. A process that exited has
// none; one that cannot be read is an error naming the step.
func processConns(procDir string, pid int, pod netip.Addr, seen map[uint64]bool) ([]int, error) {
	dir := filepath.Join(procDir, strconv.Itoa(pid), "fd")
	ents, err := os.ReadDir(dir)
	if exited(err) {
		return nil, nil
	}
	if err != nil {
		// /proc/PID/fd is its owner's alone: a process of another user
		// needs CAP_DAC_READ_SEARCH.
		return nil, fmt.Errorf("process %d: list its descriptors: %w", pid, err)
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
		if err != nil && !exited(err) {
			// PTRACE_MODE_READ: CAP_SYS_PTRACE.
			return fds, fmt.Errorf("process %d: read descriptor %s: %w", pid, e.Name(), err)
		}
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
			if pidfd, err = unix.PidfdOpen(pid, 0); exited(err) {
				return fds, nil
			} else if err != nil {
				return fds, fmt.Errorf("process %d: pidfd_open: %w", pid, err)
			}
		}
		fd, err := unix.PidfdGetfd(pidfd, num, 0)
		if exited(err) {
			continue // closed meanwhile
		}
		if err != nil {
			// CAP_SYS_PTRACE, and a seccomp profile that allows it.
			return fds, fmt.Errorf("process %d: pidfd_getfd of descriptor %d: %w", pid, num, err)
		}
		if acceptedOn(fd, pod) {
			fds = append(fds, fd)
		} else {
			_ = unix.Close(fd)
		}
	}
	return fds, nil
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
