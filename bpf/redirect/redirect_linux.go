//go:build linux

package redirect

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Options say where the programs attach and where their state is pinned.
type Options struct {
	// CgroupRoot is the cgroup v2 directory the programs attach at; they
	// see the connects of every process below it.
	CgroupRoot string
	// PinDir is a directory on a bpffs where maps and links are pinned, so
	// a restarted or upgraded agent keeps the entries and the attachment.
	// Empty means no pinning: closing the Redirect detaches everything.
	// It may be the accounting's PinDir or a directory below it: every
	// name the redirect pins starts with "redirect", and it removes no
	// other.
	PinDir string
	// Lease is how long the entries are followed after New unless Renew
	// extends it (see redirect.c: an agent that stays down must not leave
	// entries steering connects). Zero means no lease: entries are followed
	// until they are deleted (tools and tests that own the map for their
	// whole run). An agent sets it, and renews it each time its map is in
	// sync.
	Lease time.Duration
}

// The programs and where they attach, in attach order: getpeername first,
// so a connect redirected while New attaches already reads back the
// dialled address. Pinned links are named linkPrefix + name.
var attachments = []attachment{
	{"getpeername4", ebpf.AttachCgroupInet4GetPeername, func(p *redirectPrograms) *ebpf.Program { return p.SockscaleGetpeername4 }},
	{"getpeername6", ebpf.AttachCgroupInet6GetPeername, func(p *redirectPrograms) *ebpf.Program { return p.SockscaleGetpeername6 }},
	{"connect4", ebpf.AttachCGroupInet4Connect, func(p *redirectPrograms) *ebpf.Program { return p.SockscaleConnect4 }},
	{"connect6", ebpf.AttachCGroupInet6Connect, func(p *redirectPrograms) *ebpf.Program { return p.SockscaleConnect6 }},
}

type attachment struct {
	name   string
	attach ebpf.AttachType
	prog   func(*redirectPrograms) *ebpf.Program
}

// Redirect owns the loaded programs, their maps and their attachments. Its
// methods may be called concurrently, Close excepted.
type Redirect struct {
	objs   redirectObjects
	links  []link.Link
	closed bool
}

// New loads the redirect programs and attaches them at opts.CgroupRoot.
//
// With a PinDir that holds pinned state (an agent restart or upgrade), the
// maps are reused when this build's maps have the same layout, so every
// entry stays, and the programs of the pinned links are replaced in place:
// the kernel swaps the old program for the new in one step, so no connect
// finds neither or both. When the layout changed, the new maps get the old
// maps' entries and counters first (as they are if their sizes match,
// converted if they are the IPv4-only layout's, see v4layout.go; otherwise
// they start empty and connects go to the Service address until the agent
// writes its entries again), and the old maps are removed after the swap.
// Sockets redirected before a layout change keep their backend, but their
// getpeername then returns the backend's address: the dialled addresses
// were in the old maps' socket storage, which cannot be copied. (So does a
// socket the old connect program redirects while New swaps the programs,
// getpeername first.)
func New(opts Options) (*Redirect, error) {
	if opts.CgroupRoot == "" {
		return nil, errors.New("load redirect: Options.CgroupRoot is empty")
	}
	spec, err := loadRedirect()
	if err != nil {
		return nil, fmt.Errorf("load redirect spec: %w", err)
	}
	var collOpts ebpf.CollectionOptions
	mapsDir := ""
	if opts.PinDir != "" {
		layout, err := mapsLayout(spec)
		if err != nil {
			return nil, err
		}
		mapsDir = filepath.Join(opts.PinDir, layout)
		if err := os.MkdirAll(mapsDir, 0o700); err != nil {
			return nil, fmt.Errorf("create pin directory: %w", err)
		}
		for _, m := range spec.Maps {
			if m.Name == ".rodata" || m.Name == ".data" || m.Name == ".bss" {
				continue // none today; globals would be per load, never pinned
			}
			m.Pinning = ebpf.PinByName
		}
		collOpts.Maps.PinPath = mapsDir
	}

	r := &Redirect{}
	if err := spec.LoadAndAssign(&r.objs, &collOpts); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			// The whole verifier log says what was refused; %v shows only its end.
			return nil, fmt.Errorf("load redirect programs: %w\n%s", err, strings.Join(verr.Log, "\n"))
		}
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("load redirect programs: pinned maps in %s do not match this build; remove them with Uninstall: %w", mapsDir, err)
		}
		return nil, fmt.Errorf("load redirect programs: %w", err)
	}
	var old []string
	if opts.PinDir != "" {
		if old, err = otherLayouts(opts.PinDir, filepath.Base(mapsDir)); err != nil {
			return nil, errors.Join(err, r.Close())
		}
		for _, dir := range old {
			if err := r.migrate(dir); err != nil {
				return nil, errors.Join(fmt.Errorf("copy entries of %s: %w", dir, err), r.Close())
			}
		}
	}
	// Before attaching: the new programs read the lease from their first
	// connect, and a new lease map (a first install, a layout change)
	// holds 0, which has lapsed.
	lease := time.Duration(math.MaxInt64)
	if opts.Lease > 0 {
		lease = opts.Lease
	}
	if err := r.Renew(lease); err != nil {
		return nil, errors.Join(err, r.Close())
	}
	for _, at := range attachments {
		l, err := attach(opts.CgroupRoot, opts.PinDir, at.name, at.attach, at.prog(&r.objs.redirectPrograms))
		if err != nil {
			return nil, errors.Join(err, r.Close())
		}
		r.links = append(r.links, l)
	}
	if opts.PinDir != "" {
		// The pinned links run our programs now, which use our maps: the
		// old layout's maps are unused, and so are links of hooks this
		// build no longer has.
		if err := removeStale(opts.PinDir, old); err != nil {
			return nil, errors.Join(err, r.Close())
		}
	}
	return r, nil
}

// removeStale removes the map directories in old and detaches the pinned
// redirect links in pinDir that no attachment of this build owns.
func removeStale(pinDir string, old []string) error {
	var errs []error
	for _, dir := range old {
		if err := removeDir(dir); err != nil {
			errs = append(errs, fmt.Errorf("remove previous maps %s: %w", dir, err))
		}
	}
	entries, err := os.ReadDir(pinDir)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("read pin directory: %w", err))...)
	}
	for _, e := range entries {
		name, ok := strings.CutPrefix(e.Name(), linkPrefix)
		if !ok || e.IsDir() || slices.ContainsFunc(attachments, func(a attachment) bool { return a.name == name }) {
			continue
		}
		l, err := link.LoadPinnedLink(filepath.Join(pinDir, e.Name()), nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("open stale link %s: %w", e.Name(), err))
			continue
		}
		if err := errors.Join(l.Unpin(), l.Close()); err != nil {
			errs = append(errs, fmt.Errorf("detach stale link %s: %w", e.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// Names in the PinDir: the maps' directories and the links.
const (
	layoutPrefix = "redirect-maps-"
	linkPrefix   = "redirect-link-"
)

// mapsLayout names the pin directory of this build's maps after their
// layout: type, sizes, flags and the BTF of keys and values. A build that
// changes only program code reuses the maps of the one before. Tests
// replace it to play an older build.
var mapsLayout = func(spec *ebpf.CollectionSpec) (string, error) {
	h := sha256.New()
	names := make([]string, 0, len(spec.Maps))
	for name := range spec.Maps {
		names = append(names, name)
	}
	slices.Sort(names)
	var gf btf.GoFormatter
	for _, name := range names {
		m := spec.Maps[name]
		fmt.Fprintf(h, "%s %v %d %d %d %#x\n", name, m.Type, m.KeySize, m.ValueSize, m.MaxEntries, m.Flags)
		for _, t := range []btf.Type{m.Key, m.Value} {
			if t == nil {
				continue
			}
			decl, err := gf.TypeDeclaration("t", t)
			if err != nil {
				return "", fmt.Errorf("describe the layout of map %s: %w", name, err)
			}
			fmt.Fprintln(h, decl)
		}
	}
	return layoutPrefix + hex.EncodeToString(h.Sum(nil)[:6]), nil
}

// otherLayouts lists the map directories in pinDir other than current.
func otherLayouts(pinDir, current string) ([]string, error) {
	entries, err := os.ReadDir(pinDir)
	if err != nil {
		return nil, fmt.Errorf("read pin directory: %w", err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), layoutPrefix) && e.Name() != current {
			out = append(out, filepath.Join(pinDir, e.Name()))
		}
	}
	return out, nil
}

// migrate copies the entries and counters of the maps pinned in dir, an
// older layout's, into ours: as they are where their sizes match ours,
// converted where they are the IPv4-only layout's (v4layout.go); any other
// layout's start empty. It runs before the programs are swapped, while the
// old programs still count in the old maps: the few connects redirected
// between the copy and the swap are not counted in the new maps, which
// never makes a counter go back. The lease is not copied: New renews ours
// before it attaches.
//
// Only into new, empty maps: if ours already have entries, an earlier New
// copied them and the agent has written since, and the old maps are only
// there because removing them failed.
func (r *Redirect) migrate(dir string) error {
	var k redirectSvcKey
	if err := r.objs.Services.NextKey(nil, &k); err == nil {
		return nil
	} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("read entries: %w", err)
	}
	oldServices, err := loadPinned(filepath.Join(dir, "services"))
	if err != nil || oldServices == nil {
		return err
	}
	defer func() { _ = oldServices.Close() }()
	switch {
	case sameShape(oldServices, r.objs.Services):
		err = copyEntries(oldServices, r.objs.Services, func(k redirectSvcKey, e redirectSvcEntry) (redirectSvcKey, redirectSvcEntry) { return k, e })
	case v4ServicesShape(oldServices):
		err = copyEntries(oldServices, r.objs.Services, v4Entry)
	default:
		return nil // a layout this build cannot read: start empty
	}
	if err != nil {
		return err
	}

	oldCounters, err := loadPinned(filepath.Join(dir, "redirected"))
	if err != nil || oldCounters == nil {
		return err
	}
	defer func() { _ = oldCounters.Close() }()
	switch {
	case sameShape(oldCounters, r.objs.Redirected):
		return copyCounters(oldCounters, r.objs.Redirected, func(k redirectSvcKey) redirectSvcKey { return k })
	case v4CountersShape(oldCounters):
		return copyCounters(oldCounters, r.objs.Redirected, v4Key)
	}
	return nil
}

// copyEntries copies every entry of old into into, each read whole under
// its lock and converted by conv.
func copyEntries[K, V any](old, into *ebpf.Map, conv func(K, V) (redirectSvcKey, redirectSvcEntry)) error {
	var key K
	var entry V
	var keys []K
	it := old.Iterate()
	for it.Next(&key, &entry) {
		keys = append(keys, key)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read entries: %w", err)
	}
	for _, k := range keys {
		if err := old.LookupWithFlags(&k, &entry, ebpf.LookupLock); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue
			}
			return fmt.Errorf("read entry: %w", err)
		}
		nk, ne := conv(k, entry)
		if err := into.Update(&nk, &ne, ebpf.UpdateLock); err != nil {
			return fmt.Errorf("copy entry %s: %w", keyAddr(nk), err)
		}
	}
	return nil
}

// copyCounters copies every per-CPU counter of old into into, its key
// converted by conv.
func copyCounters[K any](old, into *ebpf.Map, conv func(K) redirectSvcKey) error {
	var key K
	var perCPU []uint64
	ct := old.Iterate()
	for ct.Next(&key, &perCPU) {
		nk := conv(key)
		if err := into.Update(&nk, perCPU, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("copy counter %s: %w", keyAddr(nk), err)
		}
	}
	if err := ct.Err(); err != nil {
		return fmt.Errorf("read counters: %w", err)
	}
	return nil
}

// loadPinned opens the map pinned at path read-only; nil if there is none.
func loadPinned(path string) (*ebpf.Map, error) {
	m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return m, nil
}

// sameShape reports whether m has the type and sizes of like.
func sameShape(m, like *ebpf.Map) bool {
	return m.Type() == like.Type() && m.KeySize() == like.KeySize() && m.ValueSize() == like.ValueSize()
}

// attach attaches prog at the cgroup root, or replaces the program of the
// link pinned by a previous run in one step. A pinned link at another
// cgroup (the root was moved) is replaced by a new link at the new root,
// attached before the old one is detached.
func attach(cgroupRoot, pinDir, name string, typ ebpf.AttachType, prog *ebpf.Program) (link.Link, error) {
	pin := ""
	var stale link.Link
	if pinDir != "" {
		pin = filepath.Join(pinDir, linkPrefix+name)
		l, err := link.LoadPinnedLink(pin, nil)
		switch {
		case err == nil:
			same, err := attachedAt(l, cgroupRoot)
			if err != nil {
				return nil, errors.Join(fmt.Errorf("pinned %s link %s: %w", name, pin, err), l.Close())
			}
			if !same {
				stale = l
				break
			}
			if err := l.Update(prog); err != nil {
				return nil, errors.Join(fmt.Errorf("replace %s program of pinned link %s: %w", name, pin, err), l.Close())
			}
			return l, nil
		case !errors.Is(err, os.ErrNotExist):
			return nil, fmt.Errorf("open pinned link %s: %w", pin, err)
		}
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupRoot, Attach: typ, Program: prog})
	if err != nil {
		if stale != nil {
			err = errors.Join(err, stale.Close())
		}
		return nil, fmt.Errorf("attach %s to %s: %w", name, cgroupRoot, err)
	}
	if stale != nil {
		// Unpin drops the pin's reference, Close ours: the old link goes.
		if err := errors.Join(stale.Unpin(), stale.Close()); err != nil {
			return nil, errors.Join(fmt.Errorf("detach %s link at the previous root: %w", name, err), l.Close())
		}
	}
	if pin != "" {
		if err := l.Pin(pin); err != nil {
			return nil, errors.Join(fmt.Errorf("pin %s link at %s: %w", name, pin, err), l.Close())
		}
	}
	return l, nil
}

// attachedAt reports whether the cgroup link l is attached at dir: the
// kernel names cgroups by id, which is the directory's inode number.
func attachedAt(l link.Link, dir string) (bool, error) {
	info, err := l.Info()
	if err != nil {
		return false, err
	}
	cg := info.Cgroup()
	if cg == nil {
		return false, fmt.Errorf("not a cgroup link (type %v)", info.Type)
	}
	st, err := os.Stat(dir)
	if err != nil {
		return false, fmt.Errorf("cgroup root: %w", err)
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return false, fmt.Errorf("cgroup root %s: no inode number", dir)
	}
	return sys.Ino == cg.CgroupId, nil
}

// Close releases every file descriptor. Pinned links and maps stay in the
// kernel and keep redirecting; without pins, closing detaches the programs.
// Close is idempotent and safe on a nil Redirect.
func (r *Redirect) Close() error {
	if r == nil || r.closed {
		return nil
	}
	r.closed = true
	var errs []error
	for _, l := range r.links {
		errs = append(errs, l.Close())
	}
	errs = append(errs, r.objs.Close())
	return errors.Join(errs...)
}

// Uninstall detaches the programs and removes the redirect's state pinned
// in pinDir, of every layout, and pinDir itself if nothing else is left in
// it. It is what a clean uninstall runs; a missing directory is not an
// error.
func Uninstall(pinDir string) error {
	entries, err := os.ReadDir(pinDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read pin directory: %w", err)
	}
	var errs []error
	for _, e := range entries {
		path := filepath.Join(pinDir, e.Name())
		switch {
		case e.IsDir() && strings.HasPrefix(e.Name(), layoutPrefix):
			errs = append(errs, removeDir(path))
		case !e.IsDir() && strings.HasPrefix(e.Name(), linkPrefix):
			l, err := link.LoadPinnedLink(path, nil)
			if err != nil {
				errs = append(errs, fmt.Errorf("open pinned link %s: %w", path, err))
				continue
			}
			errs = append(errs, l.Unpin(), l.Close())
		}
	}
	// Not empty: another component's pins (the accounting's) are there.
	// Busy, or read-only: a mount point (the chart mounts only this
	// directory, below the container's read-only root), which stays.
	if err := os.Remove(pinDir); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) &&
		!errors.Is(err, syscall.EBUSY) && !errors.Is(err, syscall.EROFS) {
		errs = append(errs, fmt.Errorf("remove pin directory: %w", err))
	}
	return errors.Join(errs...)
}

// removeDir removes the pins in a maps directory and the directory.
func removeDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read pin directory: %w", err)
	}
	var errs []error
	for _, e := range entries {
		// A map's pin: removing it drops the pin's reference.
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove pin: %w", err))
		}
	}
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("remove pin directory: %w", err))
	}
	return errors.Join(errs...)
}

// Set makes connects to svc go to backends, each chosen with probability
// weight / total weight, from the next connect on. It replaces any entry
// svc had in one step: a connect sees the old backends or the new ones.
// Connects already made keep their backend.
func (r *Redirect) Set(svc netip.AddrPort, backends []Backend) error {
	svc, err := checkService(svc)
	if err != nil {
		return fmt.Errorf("set: %w", err)
	}
	backends, err = checkBackends(svc, backends)
	if err != nil {
		return fmt.Errorf("set: %w", err)
	}
	key := addrKey(svc)
	entry := redirectSvcEntry{Count: uint32(len(backends)), Svc: key}
	for i, b := range backends {
		k := addrKey(b.Addr)
		entry.Backends[i] = redirectBackend{Ip: k.Ip, Port: k.Port, Weight: uint16(b.Weight)}
		entry.Total += b.Weight
	}
	// BPF_F_LOCK: copied in place under the entry's lock, which the
	// program holds while it picks (redirect.c).
	if err := r.objs.Services.Update(&key, &entry, ebpf.UpdateLock); err != nil {
		if errors.Is(err, syscall.E2BIG) {
			return fmt.Errorf("set %s: the map is full (%d Service addresses): %w", svc, MaxServices, err)
		}
		return fmt.Errorf("set %s: %w", svc, err)
	}
	return nil
}

// Renew lets the programs follow the entries for ttl from now, replacing
// the lease's end (so a shorter ttl also shortens it). A ttl past what the
// clock can hold means for good.
func (r *Redirect) Renew(ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("renew the lease: ttl %v must be positive", ttl)
	}
	var now unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &now); err != nil {
		return fmt.Errorf("renew the lease: read the boot clock: %w", err)
	}
	until := uint64(math.MaxUint64)
	if boot := uint64(now.Nano()); uint64(ttl) < math.MaxUint64-boot {
		until = boot + uint64(ttl)
	}
	if err := r.objs.Lease.Update(uint32(0), until, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("renew the lease: %w", err)
	}
	return nil
}

// Delete makes connects to svc go to svc again. Its redirected counter is
// kept, so a Service that comes back counts on (Forget drops it). Deleting
// a Service without an entry is not an error.
func (r *Redirect) Delete(svc netip.AddrPort) error {
	svc, err := checkService(svc)
	if err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	key := addrKey(svc)
	if err := r.objs.Services.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("delete %s: %w", svc, err)
	}
	return nil
}

// Forget deletes svc's entry and its redirected counter, for a Service that
// is gone.
func (r *Redirect) Forget(svc netip.AddrPort) error {
	if err := r.Delete(svc); err != nil {
		return err
	}
	svc, _ = checkService(svc)
	key := addrKey(svc)
	if err := r.objs.Redirected.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("forget %s: %w", svc, err)
	}
	return nil
}

// Entries returns every Service address with an entry and its backends, in
// the order they were set. Each entry is read whole, under its lock.
func (r *Redirect) Entries() (map[netip.AddrPort][]Backend, error) {
	var key redirectSvcKey
	var entry redirectSvcEntry
	var keys []redirectSvcKey
	it := r.objs.Services.Iterate()
	for it.Next(&key, &entry) {
		keys = append(keys, key)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read entries: %w", err)
	}
	out := make(map[netip.AddrPort][]Backend, len(keys))
	for _, k := range keys {
		if err := r.objs.Services.LookupWithFlags(&k, &entry, ebpf.LookupLock); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				continue // deleted since the iteration saw it
			}
			return nil, fmt.Errorf("read entry %s: %w", keyAddr(k), err)
		}
		n := min(entry.Count, MaxBackends)
		backends := make([]Backend, n)
		for i := range n {
			b := entry.Backends[i]
			backends[i] = Backend{Addr: keyAddr(redirectSvcKey{Ip: b.Ip, Port: b.Port}), Weight: uint32(b.Weight)}
		}
		out[keyAddr(k)] = backends
	}
	return out, nil
}

// Redirected returns how many connects were redirected per Service address,
// summed over CPUs, for every Service redirected since its counter was
// created (Delete keeps counters, Forget drops them). A connect that went
// through two entries (a split, then a revision in Proxy mode) counts at
// both.
func (r *Redirect) Redirected() (map[netip.AddrPort]uint64, error) {
	out := make(map[netip.AddrPort]uint64)
	var key redirectSvcKey
	var perCPU []uint64
	it := r.objs.Redirected.Iterate()
	for it.Next(&key, &perCPU) {
		var sum uint64
		for _, n := range perCPU {
			sum += n
		}
		out[keyAddr(key)] = sum
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read redirected counters: %w", err)
	}
	return out, nil
}

// Events returns how often the programs took an unusual path, summed over
// CPUs.
func (r *Redirect) Events() (Events, error) {
	var ev Events
	for i, dst := range []*uint64{&ev.EntryRefused, &ev.NoOrigin, &ev.CounterLost, &ev.LeaseExpired} {
		var perCPU []uint64
		if err := r.objs.Events.Lookup(uint32(i), &perCPU); err != nil {
			return Events{}, fmt.Errorf("read event %d: %w", i, err)
		}
		for _, n := range perCPU {
			*dst += n
		}
	}
	return ev, nil
}

// addrKey is the map key of an address and port: the address in 16 bytes
// (IPv4 as IPv4-mapped, as connect4 looks it up), both in network order,
// as the program reads them from the socket address.
func addrKey(a netip.AddrPort) redirectSvcKey {
	return redirectSvcKey{Ip: ipWords(a.Addr().As16()), Port: portWord(a.Port())}
}

// ipWords is a 16-byte address as the program's four words.
func ipWords(ip [16]byte) redirectIpAddr {
	var w redirectIpAddr
	for i := range w.W {
		w.W[i] = binary.NativeEndian.Uint32(ip[4*i:])
	}
	return w
}

// portWord is port in network order, as a socket address holds it.
func portWord(port uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], port)
	return binary.NativeEndian.Uint16(b[:])
}

// keyAddr is addrKey's inverse: an IPv4-mapped key gives a plain IPv4
// address.
func keyAddr(k redirectSvcKey) netip.AddrPort {
	var ip [16]byte
	for i, w := range k.Ip.W {
		binary.NativeEndian.PutUint32(ip[4*i:], w)
	}
	var port [2]byte
	binary.NativeEndian.PutUint16(port[:], k.Port)
	return netip.AddrPortFrom(netip.AddrFrom16(ip).Unmap(), binary.BigEndian.Uint16(port[:]))
}
