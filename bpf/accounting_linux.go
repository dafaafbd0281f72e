//go:build linux

package bpf

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Options say where the programs attach and where their state is pinned.
type Options struct {
	// CgroupRoot is the cgroup v2 directory the programs attach at; they see
	// the sockets of every process below it.
	CgroupRoot string
	// PinDir is a directory on a bpffs where maps and links are pinned so a
	// restarted agent keeps counting with the same state and attachment.
	// Empty means no pinning: everything goes when the Accounting is closed.
	PinDir string
}

// The programs and where they attach. Pinned links are named after them.
var attachments = []struct {
	name   string
	attach ebpf.AttachType
	prog   func(*accountingPrograms) *ebpf.Program
}{
	{"sockops", ebpf.AttachCGroupSockOps, func(p *accountingPrograms) *ebpf.Program { return p.SockscaleSockops }},
	{"ingress", ebpf.AttachCGroupInetIngress, func(p *accountingPrograms) *ebpf.Program { return p.SockscaleIngress }},
	{"egress", ebpf.AttachCGroupInetEgress, func(p *accountingPrograms) *ebpf.Program { return p.SockscaleEgress }},
}

// Accounting owns the loaded programs, their maps and their attachments.
type Accounting struct {
	objs   accountingObjects
	links  []link.Link
	closed bool

	// mu serialises the pod methods and Snapshot: they share the slot
	// assignment and Snapshot's buffers.
	mu sync.Mutex
	// slots is where each pod's counters live in pod_counters; the kernel's
	// pod_slots holds the same. Assigned lowest first, so Snapshot reads
	// the slots below slotsEnd and no more.
	slots map[netip.Addr]uint32
	// slotUsed marks the slots in use.
	slotUsed [MaxPods]bool
	// tenure is the last tenure given to a slot (resetSlot).
	tenure uint64
	// Snapshot's buffers, kept between calls: a node reads every second.
	snapKeys    []uint32
	snapVals    []accountingPodStats
	snapAdjusts []accountingConnAdjust
}

// New loads the accounting programs and attaches them at opts.CgroupRoot.
// With a PinDir that already holds pinned state (an agent restart), the maps
// are reused and the attached programs replaced in place, so counting goes
// on without a gap and without a second attachment; links pinned at another
// cgroup are moved to opts.CgroupRoot (attach).
func New(opts Options) (*Accounting, error) {
	spec, err := loadAccounting()
	if err != nil {
		return nil, fmt.Errorf("load accounting spec: %w", err)
	}
	var collOpts ebpf.CollectionOptions
	pinDir := ""
	if opts.PinDir != "" {
		// This build's objects live in a subdirectory of their own: another
		// version's maps may have another layout and are never reused.
		pinDir = filepath.Join(opts.PinDir, objectsVersion)
		if err := os.MkdirAll(pinDir, 0o700); err != nil {
			return nil, fmt.Errorf("create pin directory: %w", err)
		}
		for _, m := range spec.Maps {
			if m.Name == ".rodata" || m.Name == ".data" || m.Name == ".bss" {
				continue
			}
			m.Pinning = ebpf.PinByName
		}
		collOpts.Maps.PinPath = pinDir
	}

	a := &Accounting{slots: make(map[netip.Addr]uint32)}
	if err := spec.LoadAndAssign(&a.objs, &collOpts); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			// The whole verifier log says what was refused; %v shows only its end.
			return nil, fmt.Errorf("load accounting programs: %w\n%s", err, strings.Join(verr.Log, "\n"))
		}
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("load accounting programs: pinned maps in %s do not match this build; remove them with Uninstall (agent --uninstall): %w", pinDir, err)
		}
		return nil, fmt.Errorf("load accounting programs: %w", err)
	}
	// Pinned maps of a previous run already hold pods: take their slots.
	if err := a.loadSlots(); err != nil {
		return nil, errors.Join(err, a.Close())
	}
	// sockscale_drain sees only what the agent puts in the draining map.
	// Attached to the map, not to a cgroup: a pinned map keeps it across
	// restarts, and attaching again replaces it.
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{
		Target: a.objs.Draining.FD(), Program: a.objs.SockscaleDrain, Attach: ebpf.AttachSkMsgVerdict,
	}); err != nil {
		return nil, errors.Join(fmt.Errorf("attach the drain program to its map: %w", err), a.Close())
	}
	for _, at := range attachments {
		l, err := attach(opts.CgroupRoot, pinDir, at.name, at.attach, at.prog(&a.objs.accountingPrograms))
		if err != nil {
			return nil, errors.Join(err, a.Close())
		}
		a.links = append(a.links, l)
	}
	if opts.PinDir != "" {
		// An upgrade: the previous version's programs are still attached
		// from their own pins. Ours count now; detach theirs.
		if err := removeOtherVersions(opts.PinDir); err != nil {
			return nil, errors.Join(err, a.Close())
		}
	}
	return a, nil
}

// objectsVersion names the pin subdirectory of this build's objects: a hash
// of the BPF object file.
var objectsVersion = func() string {
	sum := sha256.Sum256(_AccountingBytes)
	return objectsPrefix + hex.EncodeToString(sum[:6])
}()

const objectsPrefix = "objects-"

func removeOtherVersions(pinDir string) error {
	entries, err := os.ReadDir(pinDir)
	if err != nil {
		return fmt.Errorf("read pin directory: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), objectsPrefix) && e.Name() != objectsVersion {
			if err := uninstallDir(filepath.Join(pinDir, e.Name())); err != nil {
				errs = append(errs, fmt.Errorf("detach previous version %s: %w", e.Name(), err))
			}
		}
	}
	return errors.Join(errs...)
}

// attach attaches prog at the cgroup root, or replaces the program of a link
// pinned by a previous run. A pinned link at another cgroup (the root was
// moved: another agent.cgroupRoot, or the node moved to an agent pool with
// its own) is replaced by a new link at the new root, attached before the
// old one is detached, as the redirect does.
func attach(cgroupRoot, pinDir, name string, typ ebpf.AttachType, prog *ebpf.Program) (link.Link, error) {
	pin := ""
	var stale link.Link
	if pinDir != "" {
		pin = filepath.Join(pinDir, "link_"+name)
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
// kernel and keep counting; without pins, closing detaches the programs.
// Close is idempotent and safe on a nil Accounting.
func (a *Accounting) Close() error {
	if a == nil || a.closed {
		return nil
	}
	a.closed = true
	var errs []error
	for _, l := range a.links {
		errs = append(errs, l.Close())
	}
	errs = append(errs, a.objs.Close())
	return errors.Join(errs...)
}

// Uninstall detaches the programs and removes the state pinned in pinDir,
// of every version. It is what a clean uninstall runs; a missing directory
// is not an error.
func Uninstall(pinDir string) error {
	return uninstallDir(pinDir)
}

func uninstallDir(pinDir string) error {
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
		if e.IsDir() {
			errs = append(errs, uninstallDir(path))
			continue
		}
		if l, err := link.LoadPinnedLink(path, nil); err == nil {
			// Unpin drops the last reference that is not ours; Close ours.
			errs = append(errs, l.Unpin(), l.Close())
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove pin: %w", err))
		}
	}
	// A mount point (the chart mounts only this directory of the host's
	// bpffs into the agent) stays, empty: removing it is EBUSY, or EROFS
	// first where its parent is on the container's read-only root.
	if err := os.Remove(pinDir); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.EBUSY) && !errors.Is(err, syscall.EROFS) {
		errs = append(errs, fmt.Errorf("remove pin directory: %w", err))
	}
	return errors.Join(errs...)
}

// loadSlots reads the slot assignment from the kernel's pod_slots.
func (a *Accounting) loadSlots() error {
	var key accountingIpAddr
	var slot uint32
	it := a.objs.PodSlots.Iterate()
	for it.Next(&key, &slot) {
		if slot >= MaxPods {
			return fmt.Errorf("pinned pod map: pod %s has slot %d, beyond the %d slots", keyIP(key), slot, MaxPods)
		}
		a.slots[keyIP(key)] = slot
		a.slotUsed[slot] = true
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read pod slots: %w", err)
	}
	return nil
}

// slotsEnd is one past the highest slot in use.
func (a *Accounting) slotsEnd() uint32 {
	end := uint32(0)
	for _, s := range a.slots {
		end = max(end, s+1)
	}
	return end
}

// ErrPodMapFull is returned by AddPod when every slot of the kernel's pod
// map is taken.
var ErrPodMapFull = fmt.Errorf("pod map full: at most %d pods per node", MaxPods)

// AddPod starts accounting for the pod at ip. id identifies the pod (a hash
// of its UID) and must not be 0: the same ip and id keep their counters (the
// agent restarted), a new id resets them (the address was reused by another
// pod).
func (a *Accounting) AddPod(ip netip.Addr, id uint64) error {
	key, err := ipKey(ip)
	if err != nil {
		return err
	}
	if id == 0 {
		return fmt.Errorf("add pod %s: id 0 marks a free slot; use any other id", ip)
	}
	ip = keyIP(key)
	a.mu.Lock()
	defer a.mu.Unlock()
	if slot, ok := a.slots[ip]; ok {
		var cur accountingPodStats
		if err := a.objs.PodCounters.Lookup(slot, &cur); err != nil {
			return fmt.Errorf("add pod %s: read slot %d: %w", ip, slot, err)
		}
		if cur.Id == id {
			return nil
		}
		// Connections of the address's previous pod keep its id, so from
		// now on they count nowhere. Under the slot's lock (see resetSlot).
		if err := a.resetSlot(slot, key, id); err != nil {
			return fmt.Errorf("add pod %s: reset slot %d: %w", ip, slot, err)
		}
		return nil
	}
	slot := uint32(0)
	for slot < MaxPods && a.slotUsed[slot] {
		slot++
	}
	if slot == MaxPods {
		return fmt.Errorf("add pod %s: %w", ip, ErrPodMapFull)
	}
	// Counters first, then the address: a connection accepted in between
	// finds a slot that is ready.
	if err := a.resetSlot(slot, key, id); err != nil {
		return fmt.Errorf("add pod %s: write slot %d: %w", ip, slot, err)
	}
	if err := a.objs.PodSlots.Update(key, slot, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("add pod %s: %w", ip, err)
	}
	a.slots[ip] = slot
	a.slotUsed[slot] = true
	return nil
}

// RemovePod stops accounting for the pod at ip and frees its slot.
// Removing an unknown pod is not an error.
func (a *Accounting) RemovePod(ip netip.Addr) error {
	key, err := ipKey(ip)
	if err != nil {
		return err
	}
	ip = keyIP(key)
	a.mu.Lock()
	defer a.mu.Unlock()
	slot, ok := a.slots[ip]
	if !ok {
		return nil
	}
	// The address first, so no new connection finds the slot; then id 0,
	// which no connection has, so the pod's open connections stop counting
	// before another pod gets the slot.
	if err := a.objs.PodSlots.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("remove pod %s: %w", ip, err)
	}
	if err := a.resetSlot(slot, accountingIpAddr{}, 0); err != nil {
		return fmt.Errorf("remove pod %s: clear slot %d: %w", ip, slot, err)
	}
	delete(a.slots, ip)
	a.slotUsed[slot] = false
	return nil
}

// resetSlot gives a slot zeroed counters of the pod with address key and
// id (0 and 0: a free slot). The whole value is written under the slot's
// lock (BPF_F_LOCK), under which the programs check the slot's owner and
// count: a connection of the slot's previous pod either counted before
// (and this wipes it) or sees the new id and counts nothing. A plain
// update copies the value without the lock, and a count in between landed
// in the next pod's counters (TestKernelSlotReuseRace).
//
// Each reset of a pod gives the slot a new tenure, which connections
// accepted from then on keep: a pod removed and added again with the same
// id, into the same slot, must not have its fresh counters completed by
// requests counted before (TestKernelPodAddedAgainInItsSlot: N read -1).
// Tenures are CLOCK_MONOTONIC nanoseconds, made strictly increasing: a
// restarted agent's are later than any its predecessor wrote.
func (a *Accounting) resetSlot(slot uint32, key accountingIpAddr, id uint64) error {
	tenure := uint64(0) // a free slot's
	if id != 0 {
		now, err := monotonicNow()
		if err != nil {
			return err
		}
		a.tenure = max(a.tenure+1, uint64(now))
		tenure = a.tenure
	}
	// The agent's correction first: the old one belongs to the old
	// tenure, and Snapshot applies a correction only to its own tenure.
	if err := a.objs.ConnAdjusts.Update(slot, &accountingConnAdjust{Tenure: tenure}, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("reset connection correction: %w", err)
	}
	return a.objs.PodCounters.Update(slot, &accountingPodStats{Ip: key, Id: id, Tenure: tenure}, ebpf.UpdateLock)
}

// Pods returns the pods the kernel accounts for, with their ids.
func (a *Accounting) Pods() (map[netip.Addr]uint64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[netip.Addr]uint64, len(a.slots))
	for ip, slot := range a.slots {
		var cur accountingPodStats
		if err := a.objs.PodCounters.Lookup(slot, &cur); err != nil {
			return nil, fmt.Errorf("read pod %s: %w", ip, err)
		}
		out[ip] = cur.Id
	}
	return out, nil
}

// SetActivators makes ips the set of activator addresses: requests from
// them count as proxied, and their prober's as health probes. Connections
// keep the marking they got when they were accepted.
func (a *Accounting) SetActivators(ips []netip.Addr) error {
	return setAddrs(a.objs.Activators, "activator", ips, MaxActivators)
}

// SetNodeAddrs makes ips the node's own addresses, which the agent follows
// as they change: of the pods' clients, only these and the activators may
// send health probes (the kubelet's come from one of the node's
// addresses); a probe's User-Agent from any other client is load.
// Connections keep what they were when they were accepted; the kubelet
// opens a new one for each probe. 0.0.0.0 stands for every client: a probe's
// User-Agent is then believed from anyone (for an agent that cannot see
// the node's addresses).
func (a *Accounting) SetNodeAddrs(ips []netip.Addr) error {
	return setAddrs(a.objs.NodeAddrs, "node address", ips, MaxNodeAddrs)
}

// setAddrs makes the keys of the address set m exactly ips (at most max),
// adding before it removes nothing it keeps: a lookup never misses an
// address that stays.
func setAddrs(m *ebpf.Map, what string, ips []netip.Addr, limit int) error {
	want := make(map[accountingIpAddr]bool, len(ips))
	for _, ip := range ips {
		key, err := ipKey(ip)
		if err != nil {
			return fmt.Errorf("set %ss: %w", what, err)
		}
		want[key] = true
	}
	if len(want) > limit {
		return fmt.Errorf("set %ss: %d addresses, at most %d allowed", what, len(want), limit)
	}
	var key accountingIpAddr
	var val uint8
	var stale []accountingIpAddr
	it := m.Iterate()
	for it.Next(&key, &val) {
		if !want[key] {
			stale = append(stale, key)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("iterate %ss: %w", what, err)
	}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("remove %s %s: %w", what, keyIP(k), err)
		}
	}
	for k := range want {
		if err := m.Update(k, uint8(1), ebpf.UpdateAny); err != nil {
			return fmt.Errorf("add %s %s: %w", what, keyIP(k), err)
		}
	}
	return nil
}

// Snapshot reads every pod's counters. Each pod's request counters are read
// under its lock, so in-flight count, start-time sum and completed time are
// of one instant, and the areas are evaluated at the returned At.
func (a *Accounting) Snapshot() (Snapshot, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.snapKeys == nil {
		a.snapKeys, a.snapVals = make([]uint32, MaxPods), make([]accountingPodStats, MaxPods)
		a.snapAdjusts = make([]accountingConnAdjust, MaxPods)
	}
	// One batch syscall reads the slots in use, which are the lowest ones.
	end := a.slotsEnd()
	keys, vals, adjusts := a.snapKeys[:end], a.snapVals[:end], a.snapAdjusts[:end]
	if end > 0 {
		if err := batchRead(a.objs.PodCounters, keys, vals, ebpf.LookupLock); err != nil {
			return Snapshot{}, fmt.Errorf("read pods: %w", err)
		}
		// Only this agent writes the corrections, under a.mu.
		if err := batchRead(a.objs.ConnAdjusts, keys, adjusts, 0); err != nil {
			return Snapshot{}, fmt.Errorf("read connection corrections: %w", err)
		}
	}
	// Read the clock after the counters: every start time in them is then
	// before now, and the areas are exact as of now.
	now, err := monotonicNow()
	if err != nil {
		return Snapshot{}, err
	}
	snap := Snapshot{At: now, Pods: make(map[netip.Addr]PodCounters, len(a.slots))}
	for ip, slot := range a.slots {
		v := vals[slot]
		snap.Pods[ip] = PodCounters{
			Requests:            requestCounters(v.All.InFlight, v.All.Started, v.All.Completed, v.All.StartSumNs, v.All.DoneSumNs, now),
			Proxied:             requestCounters(v.Proxied.InFlight, v.Proxied.Started, v.Proxied.Completed, v.Proxied.StartSumNs, v.Proxied.DoneSumNs, now),
			ConnsInFlight:       connsInFlight(v, adjusts[slot]),
			ConnsTotal:          v.ConnsTotal,
			OpaqueConnsInFlight: v.OpaqueInFlight,
			OpaqueConnsTotal:    v.OpaqueTotal,
			H2ConnsInFlight:     v.H2InFlight,
			H2ConnsTotal:        v.H2Total,
			ProbesTotal:         v.ProbesTotal,
		}
	}
	return snap, nil
}

// batchRead reads the first len(keys) slots of the array m into vals in
// one syscall.
func batchRead[V any](m *ebpf.Map, keys []uint32, vals []V, flags ebpf.MapLookupFlags) error {
	var cursor ebpf.MapBatchCursor
	n, err := m.BatchLookup(&cursor, keys, vals, &ebpf.BatchOptions{ElemFlags: uint64(flags)})
	// ErrKeyNotExist: the batch reached the array's end (all slots in use).
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	if n != len(keys) {
		return fmt.Errorf("%d of %d slots read", n, len(keys))
	}
	return nil
}

// connsInFlight is a slot's open connections: those the programs count,
// less the learned ones they took over, plus the agent's correction (the
// connections it learned, see Audit) when that is of the slot's tenure.
func connsInFlight(v accountingPodStats, adj accountingConnAdjust) int64 {
	n := v.ConnsInFlight - int64(v.LearnedGone)
	if adj.Tenure == v.Tenure {
		n += adj.Conns
	}
	return n
}

// Events returns how often the kernel side hit a limit, lost a stream or
// found it again, summed over CPUs.
func (a *Accounting) Events() (Events, error) {
	var ev Events
	for i, dst := range []*uint64{&ev.ConnUntracked, &ev.ParseLimit, &ev.ParseError, &ev.StreamGap, &ev.Resync, &ev.Adopted, &ev.H2Full, &ev.H2Lost, &ev.RxWait, &ev.RxTakeover} {
		var perCPU []uint64
		if err := a.objs.Events.Lookup(uint32(i), &perCPU); err != nil {
			return Events{}, fmt.Errorf("read event %d: %w", i, err)
		}
		for _, n := range perCPU {
			*dst += n
		}
	}
	return ev, nil
}

// requestCounters evaluates the area C + N*now - S (see accounting.c).
func requestCounters(inFlight int64, started, completed, startSum, doneSum uint64, now time.Duration) RequestCounters {
	area := int64(doneSum) + inFlight*int64(now) - int64(startSum)
	if area < 0 {
		area = 0 // cannot happen with a consistent read; never report negative time
	}
	return RequestCounters{InFlight: inFlight, Started: started, Completed: completed, Area: time.Duration(area)}
}

func monotonicNow() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read monotonic clock: %w", err)
	}
	return time.Duration(ts.Nano()), nil
}

// ipKey is the map key of an address (struct ip_addr): its 16 bytes in
// network order, an IPv4 address IPv4-mapped, as the kernel compares them.
func ipKey(ip netip.Addr) (accountingIpAddr, error) {
	var key accountingIpAddr
	if !ip.IsValid() {
		return key, errors.New("no address: want an IPv4 or IPv6 address")
	}
	if ip.Zone() != "" {
		return key, fmt.Errorf("address %s: a pod's address has no zone", ip)
	}
	b := ip.Unmap().As16() // IPv4 comes out mapped
	for i := range key.W {
		key.W[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return key, nil
}

// keyIP is the address of a map key; IPv4 comes back unmapped.
func keyIP(key accountingIpAddr) netip.Addr {
	var b [16]byte
	for i, w := range key.W {
		binary.NativeEndian.PutUint32(b[4*i:], w)
	}
	return netip.AddrFrom16(b).Unmap()
}

// RunTime is how long the accounting programs have run, in total, and how
// often, since they were loaded. The kernel only keeps these while BPF
// run-time statistics are enabled (EnableRunTimeStats).
func (a *Accounting) RunTime() (total time.Duration, runs uint64, err error) {
	for _, p := range []*ebpf.Program{a.objs.SockscaleSockops, a.objs.SockscaleIngress, a.objs.SockscaleEgress} {
		st, err := p.Stats()
		if err != nil {
			return 0, 0, fmt.Errorf("read program statistics: %w", err)
		}
		total += st.Runtime
		runs += st.RunCount
	}
	return total, runs, nil
}

// EnableRunTimeStats makes the kernel measure BPF programs' run time until
// the returned Closer is closed. Measuring costs a clock read per run.
func EnableRunTimeStats() (io.Closer, error) {
	c, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		return nil, fmt.Errorf("enable BPF run-time statistics: %w", err)
	}
	return c, nil
}
