//go:build !linux

package redirect

import (
	"errors"
	"net/netip"
	"time"
)

// ErrUnsupported is returned on systems without Linux BPF.
var ErrUnsupported = errors.New("bpf redirect needs Linux")

// Options say where the programs attach and where their state is pinned.
type Options struct {
	CgroupRoot string
	PinDir     string
	Lease      time.Duration
}

// Redirect is unavailable off Linux; every method fails.
type Redirect struct{}

// New fails off Linux.
func New(Options) (*Redirect, error) { return nil, ErrUnsupported }

// Uninstall fails off Linux.
func Uninstall(string) error { return ErrUnsupported }

// Close does nothing.
func (r *Redirect) Close() error { return nil }

// Set fails off Linux.
func (r *Redirect) Set(netip.AddrPort, []Backend) error { return ErrUnsupported }

// Renew fails off Linux.
func (r *Redirect) Renew(time.Duration) error { return ErrUnsupported }

// Delete fails off Linux.
func (r *Redirect) Delete(netip.AddrPort) error { return ErrUnsupported }

// Forget fails off Linux.
func (r *Redirect) Forget(netip.AddrPort) error { return ErrUnsupported }

// Entries fails off Linux.
func (r *Redirect) Entries() (map[netip.AddrPort][]Backend, error) { return nil, ErrUnsupported }

// Redirected fails off Linux.
func (r *Redirect) Redirected() (map[netip.AddrPort]uint64, error) { return nil, ErrUnsupported }

// Events fails off Linux.
func (r *Redirect) Events() (Events, error) { return Events{}, ErrUnsupported }
