//go:build !linux

package bpf

import (
	"errors"
	"net/netip"
)

// ErrUnsupported is returned on systems without Linux BPF.
var ErrUnsupported = errors.New("bpf accounting needs Linux")

// Options say where the programs attach and where their state is pinned.
type Options struct {
	CgroupRoot string
	PinDir     string
}

// Accounting is unavailable off Linux; every method fails.
type Accounting struct{}

// New fails off Linux.
func New(Options) (*Accounting, error) { return nil, ErrUnsupported }

// Uninstall fails off Linux.
func Uninstall(string) error { return ErrUnsupported }

// Close does nothing.
func (a *Accounting) Close() error { return nil }

// AddPod fails off Linux.
func (a *Accounting) AddPod(netip.Addr, uint64) error { return ErrUnsupported }

// RemovePod fails off Linux.
func (a *Accounting) RemovePod(netip.Addr) error { return ErrUnsupported }

// Pods fails off Linux.
func (a *Accounting) Pods() (map[netip.Addr]uint64, error) { return nil, ErrUnsupported }

// SetActivators fails off Linux.
func (a *Accounting) SetActivators([]netip.Addr) error { return ErrUnsupported }

// SetNodeAddrs fails off Linux.
func (a *Accounting) SetNodeAddrs([]netip.Addr) error { return ErrUnsupported }

// Snapshot fails off Linux.
func (a *Accounting) Snapshot() (Snapshot, error) { return Snapshot{}, ErrUnsupported }

// Events fails off Linux.
func (a *Accounting) Events() (Events, error) { return Events{}, ErrUnsupported }

// OpenConn is a pod's open server connection in the socket table.
type OpenConn struct {
	Cookie   uint64
	State    []byte
	Accepted bool
}

// Audit is what one check of a pod's connections found.
type Audit struct {
	Open, Followed, Learned, Uncounted, Pending, Unseen, Gone int
	Drift                                                     int64
	Stable, Full                                              bool
}

// Miscounted is how far the counters were from the socket table.
func (r Audit) Miscounted() int64 { return int64(r.Gone-r.Unseen) + r.Drift }

// ConnStore fails off Linux.
func (a *Accounting) ConnStore() (int, uint32, error) { return 0, 0, ErrUnsupported }

// AuditPass checks pods with one read of the learned connections.
type AuditPass struct{}

// NewAuditPass fails off Linux.
func (a *Accounting) NewAuditPass() (*AuditPass, error) { return nil, ErrUnsupported }

// Audit fails off Linux.
func (p *AuditPass) Audit(netip.Addr, func() ([]OpenConn, error)) (Audit, error) {
	return Audit{}, ErrUnsupported
}

// Drain fails off Linux.
func (a *Accounting) Drain(int) error { return ErrUnsupported }

// ConnActivity fails off Linux.
func (a *Accounting) ConnActivity(int) (ConnActivity, error) { return ConnUnknown, ErrUnsupported }
