package socktable

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Find returns, for each address of want held by an interface of some
// network namespace, that namespace. It looks at every namespace a name
// under NetnsDir or a process under ProcDir leads to, each once (by
// inode), and lists its IPv4 addresses (want is IPv4: IPv4-mapped
// addresses are unmapped, IPv6 ones never found). Processes that exit
// while it looks are skipped.
//
// The map comes with an error, still valid, when the answer may be
// incomplete: an address held by more than one namespace (one a CNI failed
// to clean up still holding a reused pod address) is left out of the map
// and named; and when some addresses were not found while some processes'
// namespaces could not be read (no ptrace access to them), that is said.
//
// Its cost is about 0.1 ms per namespace on the node (entering each to
// make a netlink socket there is most of it) plus a stat per process,
// whatever the number of addresses wanted: ask for many at once.
func (f Finder) Find(want []netip.Addr) (map[netip.Addr]Namespace, error) {
	found := make(map[netip.Addr]Namespace)
	wanted := make(map[netip.Addr]bool, len(want))
	for _, a := range want {
		if a = a.Unmap(); a.IsValid() {
			wanted[a] = true
		}
	}
	if len(wanted) == 0 {
		return found, nil
	}
	procDir, netnsDir := f.ProcDir, f.NetnsDir
	if procDir == "" {
		procDir = "/proc"
	}
	if netnsDir == "" {
		netnsDir = "/var/run/netns"
	}
	// Every namespace file is on the one nsfs, ours too: a name under
	// netnsDir on any other device is a mount point left behind by a
	// deleted namespace.
	var own unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &own); err != nil {
		return nil, fmt.Errorf("find network namespaces: stat our own: %w", err)
	}

	seen := make(map[uint64]bool)
	unreadable, firstUnreadable := 0, error(nil)
	holders := make(map[netip.Addr][]Namespace)
	visit := func(path string) error {
		var st unix.Stat_t
		if err := unix.Stat(path, &st); errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
			// Exited, or a name being deleted.
			return nil
		} else if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
			// Reading another process's namespace takes ptrace access
			// (CAP_SYS_PTRACE, and the kernel may still refuse a process
			// with capabilities we lack): said below if it may matter.
			if unreadable++; firstUnreadable == nil {
				firstUnreadable = fmt.Errorf("stat %s: %w", path, err)
			}
			return nil
		} else if err != nil {
			return fmt.Errorf("stat %s: %w", path, err)
		}
		if st.Dev != own.Dev || seen[st.Ino] {
			return nil
		}
		ns := Namespace{Path: path, Dev: st.Dev, Inode: st.Ino}
		addrs, err := ns.Addrs()
		if errors.Is(err, ErrNamespaceGone) {
			// Exited between stat and open: another of the namespace's
			// processes, if any, will be looked at.
			return nil
		}
		if err != nil {
			return err
		}
		seen[st.Ino] = true
		for _, a := range addrs {
			if wanted[a] {
				holders[a] = append(holders[a], ns)
			}
		}
		return nil
	}

	names, err := readDirNames(netnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("find network namespaces: %w", err)
	}
	for _, name := range names {
		if err := visit(filepath.Join(netnsDir, name)); err != nil {
			return nil, fmt.Errorf("find network namespaces: %w", err)
		}
	}
	pids, err := readDirNames(procDir)
	if err != nil {
		return nil, fmt.Errorf("find network namespaces: %w", err)
	}
	for _, pid := range pids {
		if !isPID(pid) {
			continue
		}
		if err := visit(filepath.Join(procDir, pid, "ns/net")); err != nil {
			return nil, fmt.Errorf("find network namespaces: %w", err)
		}
	}

	var errs []error
	for _, a := range slices.SortedFunc(maps.Keys(holders), netip.Addr.Compare) {
		if nss := holders[a]; len(nss) > 1 {
			errs = append(errs, fmt.Errorf("address %s is in more than one network namespace: %v", a, nss))
		} else {
			found[a] = nss[0]
		}
	}
	if missing := len(wanted) - len(holders); missing > 0 && unreadable > 0 {
		errs = append(errs, fmt.Errorf("%d of the addresses not found, and %d processes' namespaces could not be read (the first: %w)", missing, unreadable, firstUnreadable))
	}
	return found, errors.Join(errs...)
}

// readDirNames lists the names in dir unsorted: os.ReadDir would sort
// them, which costs and which nothing here needs.
func readDirNames(dir string) ([]string, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Readdirnames(-1)
}

func isPID(name string) bool {
	if name == "" {
		return false
	}
	for _, c := range name {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// Addrs lists the addresses (IPv4 and IPv6) of the namespace's interfaces, to check
// that a namespace found before still holds an address without a whole
// Find. It fails with ErrNamespaceGone as Open does.
func (n Namespace) Addrs() ([]netip.Addr, error) {
	h, err := n.Open()
	if err != nil {
		return nil, err
	}
	defer closeFD(int(h))
	// Only NETLINK_ROUTE: without a family NewHandleAt opens three
	// sockets, each entering and leaving the namespace.
	nh, err := netlink.NewHandleAt(h, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket in %s: %w", n, err)
	}
	defer nh.Close()
	var list []netlink.Addr
	// A dump interrupted by a change (a pod's address being added while
	// we look) may miss addresses: try again.
	for range 3 {
		list, err = nh.AddrList(nil, netlink.FAMILY_ALL)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("list addresses of %s: %w", n, err)
	}
	addrs := make([]netip.Addr, 0, len(list))
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			addrs = append(addrs, ip.Unmap())
		}
	}
	return addrs, nil
}

// Open opens the namespace for setns and netlink.NewHandleAt; the caller
// closes the handle. It fails with ErrNamespaceGone when the path no longer
// leads to the namespace (its process exited, or the PID now belongs to a
// process of another namespace, or the name was deleted).
func (n Namespace) Open() (netns.NsHandle, error) {
	fd, err := unix.Open(n.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
		return netns.None(), fmt.Errorf("open %s: %w: %w", n, ErrNamespaceGone, err)
	}
	if err != nil {
		return netns.None(), fmt.Errorf("open %s: %w", n, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		closeFD(fd)
		return netns.None(), fmt.Errorf("stat %s: %w", n, err)
	}
	if st.Dev != n.Dev || st.Ino != n.Inode {
		closeFD(fd)
		return netns.None(), fmt.Errorf("open %s: %w: it now leads to inode %d", n, ErrNamespaceGone, st.Ino)
	}
	return netns.NsHandle(fd), nil
}

// closeFD closes a namespace or socket fd we are done with: the kernel
// releases it whatever close returns, and nothing was written through it
// that a failed close could lose.
func closeFD(fd int) { _ = unix.Close(fd) }
