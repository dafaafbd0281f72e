//go:build linux

package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ConnStore returns the file descriptor and the kernel's ID of the map that
// holds each connection's state in its socket's storage: a socket-table
// dump (sock_diag) asked for the map by its descriptor returns each
// socket's state under the ID. Both stay valid until Close.
func (a *Accounting) ConnStore() (fd int, id uint32, err error) {
	info, err := a.objs.ConnStore.Info()
	if err != nil {
		return 0, 0, fmt.Errorf("connection state map: %w", err)
	}
	mid, ok := info.ID()
	if !ok {
		return 0, 0, errors.New("connection state map: the kernel reports no ID")
	}
	return a.objs.ConnStore.FD(), uint32(mid), nil
}

// OpenConn is one open server connection of a pod as the kernel's socket
// table shows it (the server's socket, ESTABLISHED or CLOSE_WAIT: the
// programs count a connection until the server closes its side).
type OpenConn struct {
	// Cookie is the socket's cookie, as bpf_get_socket_cookie returns it.
	Cookie uint64
	// State is the socket's storage in the map of ConnStore, nil if the
	// socket has none: the programs never saw the connection.
	State []byte
	// Accepted says the server's process has accepted the connection (the
	// socket has a file: an inode). One without state that is not accepted
	// yet may be in the instant between TCP establishing it and the
	// programs' callback: it is left for the next check, never learned.
	Accepted bool
}

// Audit is what one check of a pod's connections against the socket
// table found and corrected.
type Audit struct {
	// Open is how many server connections the socket table holds.
	Open int
	// Followed have state the programs count with; Learned are counted by
	// the agent's correction since an earlier check (no segment since);
	// Uncounted have state that counts nowhere (accepted while the slot
	// changed hands, or the pod's own client connection to a port it also
	// listens on); Pending have no state and are not accepted yet (see
	// OpenConn.Accepted).
	Followed, Learned, Uncounted, Pending int
	// Unseen had no state and were not learned: learned now.
	Unseen int
	// Gone were learned earlier and are closed now, or followed by the
	// programs: no longer in the correction.
	Gone int
	// Drift is how many connections more than the socket table holds the
	// counters had after the corrections above, corrected too; Stable says
	// whether it could be measured (no connection came, went or was taken
	// over while the table was read; else Drift is 0).
	Drift  int64
	Stable bool
	// Full says some unseen connections could not be learned: the kernel's
	// map of learned connections (MaxLearned) is full.
	Full bool
}

// Miscounted is how far the counters were from the socket table before
// this check's corrections: positive for connections counted that are not
// open, negative for open ones not counted.
func (r Audit) Miscounted() int64 { return int64(r.Gone-r.Unseen) + r.Drift }

// AuditPass checks pods one after the other with one read of the learned
// connections (a map of up to MaxLearned entries: read per pod, a node's
// check would cost pods times that).
type AuditPass struct {
	a *Accounting
	// learned are the learned connections by slot: cookie -> tenure.
	learned map[uint32]map[uint64]uint64
}

// NewAuditPass reads the learned connections for a pass of Audits, and
// deletes those of slots no pod holds (it went: they count nowhere).
func (a *Accounting) NewAuditPass() (*AuditPass, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := &AuditPass{a: a, learned: make(map[uint32]map[uint64]uint64)}
	var cookie uint64
	var l accountingLearnedConn
	var stale []uint64
	it := a.objs.Learned.Iterate()
	for it.Next(&cookie, &l) {
		if l.Slot >= MaxPods || !a.slotUsed[l.Slot] {
			stale = append(stale, cookie)
			continue
		}
		if p.learned[l.Slot] == nil {
			p.learned[l.Slot] = make(map[uint64]uint64)
		}
		p.learned[l.Slot][cookie] = l.Tenure
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read learned connections: %w", err)
	}
	if err := a.forget(stale); err != nil {
		return nil, err
	}
	return p, nil
}

// forget deletes learned connections that count nowhere.
func (a *Accounting) forget(cookies []uint64) error {
	for _, c := range cookies {
		if err := a.objs.Learned.Delete(c); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("forget connection %#x of a pod that went: %w", c, err)
		}
	}
	return nil
}

// Audit checks the pod at ip against its open server connections in the
// kernel's socket table, which dump reads (sock_diag in the pod's network
// namespace, with each socket's state from ConnStore). Connections the
// programs never saw (accepted before they were loaded or before the pod
// was added, idle since) are learned: counted by the agent's correction
// until their first segment, when the programs take them over
// (lib/adopt.h). Learned connections found closed are taken off. If the
// pod's counters held still while the table was read, what they still
// disagree on is drift (a connection that closed unseen), and is
// corrected too. The learned connections the pass read may have been
// taken over by the programs since: those have state, or are closed, and
// are found so in the table.
func (p *AuditPass) Audit(ip netip.Addr, dump func() ([]OpenConn, error)) (Audit, error) {
	a := p.a
	key, err := ipKey(ip)
	if err != nil {
		return Audit{}, err
	}
	ip = keyIP(key)
	a.mu.Lock()
	slot, ok := a.slots[ip]
	a.mu.Unlock()
	if !ok {
		return Audit{}, fmt.Errorf("audit pod %s: not accounted", ip)
	}
	var before, after accountingPodStats
	if err := a.objs.PodCounters.LookupWithFlags(slot, &before, ebpf.LookupLock); err != nil {
		return Audit{}, fmt.Errorf("audit pod %s: read counters: %w", ip, err)
	}
	conns, err := dump()
	if err != nil {
		return Audit{}, fmt.Errorf("audit pod %s: %w", ip, err)
	}
	// Serialised with the pod methods (a slot reset) and Snapshot (which
	// reads the correction this writes).
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.slots[ip] != slot {
		return Audit{}, fmt.Errorf("audit pod %s: removed while its connections were read", ip)
	}
	if err := a.objs.PodCounters.LookupWithFlags(slot, &after, ebpf.LookupLock); err != nil {
		return Audit{}, fmt.Errorf("audit pod %s: read counters: %w", ip, err)
	}
	if after.Tenure != before.Tenure {
		return Audit{}, fmt.Errorf("audit pod %s: reset while its connections were read", ip)
	}
	var adj accountingConnAdjust
	if err := a.objs.ConnAdjusts.Lookup(slot, &adj); err != nil {
		return Audit{}, fmt.Errorf("audit pod %s: read correction: %w", ip, err)
	}
	if adj.Tenure != after.Tenure {
		adj = accountingConnAdjust{Tenure: after.Tenure}
	}
	// This pod's learned connections; those of the slot's earlier tenures
	// (the address's previous pod) count nowhere.
	learned := make(map[uint64]bool, len(p.learned[slot]))
	var stale []uint64
	for cookie, tenure := range p.learned[slot] {
		if tenure == after.Tenure {
			learned[cookie] = true
		} else {
			stale = append(stale, cookie)
		}
	}
	if err := a.forget(stale); err != nil {
		return Audit{}, fmt.Errorf("audit pod %s: %w", ip, err)
	}

	r := Audit{Open: len(conns)}
	// Each open connection's cookie: whether it has state.
	open := make(map[uint64]bool, len(conns))
	for _, c := range conns {
		open[c.Cookie] = c.State != nil
		if c.State != nil {
			if stateCounts(c.State, after.Tenure) {
				r.Followed++
			} else {
				r.Uncounted++
			}
			continue // learned earlier and followed now: taken off below
		}
		if learned[c.Cookie] {
			r.Learned++
			continue
		}
		if !c.Accepted {
			r.Pending++
			continue
		}
		err := a.objs.Learned.Update(c.Cookie, &accountingLearnedConn{Tenure: after.Tenure, Slot: slot}, ebpf.UpdateNoExist)
		switch {
		case err == nil:
			r.Unseen++
			adj.Conns++
		case errors.Is(err, ebpf.ErrKeyExist):
			r.Learned++ // in the map already, though not when this pass read it: counted once
		case errors.Is(err, unix.E2BIG):
			r.Full = true // a hash map refuses new keys when full
		default:
			return r, a.writeAdjust(slot, adj, fmt.Errorf("audit pod %s: learn connection %#x: %w", ip, c.Cookie, err))
		}
	}
	for cookie := range learned {
		if hasState, ok := open[cookie]; ok && !hasState {
			continue
		}
		// Closed unseen, or the programs follow it now. Whoever deletes
		// the entry accounts for it: if the programs took it over in the
		// meantime, they counted learned_gone.
		err := a.objs.Learned.Delete(cookie)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return r, a.writeAdjust(slot, adj, fmt.Errorf("audit pod %s: forget connection %#x: %w", ip, cookie, err))
		}
		r.Gone++
		adj.Conns--
	}
	// Drift only when nothing moved while the table was read: no accept,
	// no close, no learned connection taken over. Then the counters and
	// the table describe the same instant.
	r.Stable = before.ConnsInFlight == after.ConnsInFlight && before.ConnsTotal == after.ConnsTotal &&
		before.LearnedGone == after.LearnedGone
	if r.Stable {
		counted := connsInFlight(after, adj)
		r.Drift = counted - int64(r.Followed+r.Learned+r.Unseen)
		adj.Conns -= r.Drift
	}
	return r, a.writeAdjust(slot, adj, nil)
}

// writeAdjust writes a slot's correction and joins any error to err.
func (a *Accounting) writeAdjust(slot uint32, adj accountingConnAdjust, err error) error {
	if werr := a.objs.ConnAdjusts.Update(slot, &adj, ebpf.UpdateAny); werr != nil {
		return errors.Join(err, fmt.Errorf("write correction of slot %d: %w", slot, werr))
	}
	return err
}

// Where stateCounts reads a connection's state (struct conn) in socket storage.
var (
	connSize       = int(unsafe.Sizeof(accountingConn{}))
	connTenureOff  = int(unsafe.Offsetof(accountingConn{}.Tenure))
	connClosedOff  = int(unsafe.Offsetof(accountingConn{}.Closed))
	connCountedOff = int(unsafe.Offsetof(accountingConn{}.Counted))
)

// stateCounts says whether a connection's state (struct conn, as the socket's
// storage holds it) counts as an open connection of the slot in tenure.
func stateCounts(state []byte, tenure uint64) bool {
	if len(state) < connSize {
		return false
	}
	return state[connCountedOff] != 0 && state[connClosedOff] == 0 &&
		binary.NativeEndian.Uint64(state[connTenureOff:]) == tenure
}
