package redirect

import (
	"errors"
	"fmt"
	"net/netip"
)

// Limits of the kernel's map (redirect.c's #defines; TestHeaderMatchesGo
// keeps them equal).
const (
	// MaxServices is how many Service addresses can have an entry at once.
	MaxServices = 16384
	// MaxBackends is how many backends one entry can have.
	MaxBackends = 32
	// MaxWeight is the largest weight of a backend.
	MaxWeight = 65535
	// MaxHops is how many entries one connect follows: a backend that is
	// itself a Service address with an entry (a split's revision in
	// Proxy mode) sends the connect on to one of its backends.
	MaxHops = 2
)

// Backend is where a redirected connect may go: an activator in Proxy mode,
// a revision's Service address in a traffic split (whose own entry, if it
// has one, is followed: see MaxHops). Each connect picks one
// backend of its Service with probability Weight / (sum of the weights).
type Backend struct {
	Addr   netip.AddrPort
	Weight uint32 // 1..MaxWeight
}

// Events count the unusual paths the programs took, summed over CPUs.
type Events struct {
	// EntryRefused: connects to a Service with an entry left as they
	// were because the entry was unusable (see redirect.c).
	EntryRefused uint64
	// NoOrigin: redirected connects whose dialled address could not be
	// kept (no memory for socket storage): their getpeername shows the
	// backend.
	NoOrigin uint64
	// CounterLost: redirected connects not counted because the counter
	// map is full.
	CounterLost uint64
	// LeaseExpired: connects to a Service with an entry left as they were
	// because the agent's lease on the map had lapsed (Options.Lease).
	LeaseExpired uint64
}

// ErrInvalid is wrapped by every error about a caller's bad input.
var ErrInvalid = errors.New("invalid redirect")

type invalidError struct{ msg string }

func (e *invalidError) Error() string        { return e.msg }
func (e *invalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(format string, args ...any) error {
	return &invalidError{fmt.Sprintf(format, args...)}
}

// checkService returns svc with a plain address (an IPv4-mapped one
// unmapped: the kernel's key of both is the same), or an error naming what
// is wrong with it.
func checkService(svc netip.AddrPort) (netip.AddrPort, error) {
	ip := svc.Addr().Unmap()
	switch {
	case !ip.IsValid():
		return svc, invalid("service %s: no address", svc)
	case ip.Zone() != "":
		return svc, invalid("service %s: a zoned address is not a Service address", svc)
	case ip.IsUnspecified():
		return svc, invalid("service %s: the unspecified address %s is not a Service address", svc, ip)
	case svc.Port() == 0:
		return svc, invalid("service %s: port 0, want 1..65535", svc)
	}
	return netip.AddrPortFrom(ip, svc.Port()), nil
}

// family names an address's family in errors.
func family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// checkBackends returns backends with plain addresses (IPv4-mapped ones
// unmapped), or an error naming the first bad one, its position and the
// allowed range. svc is checkService's: every backend must be of its family,
// since a connect keeps its socket's family (the program refuses a mixed
// entry too).
func checkBackends(svc netip.AddrPort, backends []Backend) ([]Backend, error) {
	if n := len(backends); n < 1 || n > MaxBackends {
		return nil, invalid("service %s: %d backends, want 1..%d", svc, n, MaxBackends)
	}
	out := make([]Backend, len(backends))
	seen := make(map[netip.AddrPort]int, len(backends))
	for i, b := range backends {
		ip := b.Addr.Addr().Unmap()
		switch {
		case !ip.IsValid():
			return nil, invalid("service %s: backend %d (%s): no address", svc, i, b.Addr)
		case ip.Zone() != "":
			return nil, invalid("service %s: backend %d (%s): a zoned address cannot be a backend", svc, i, b.Addr)
		case ip.Is4() != svc.Addr().Is4():
			return nil, invalid("service %s: backend %d (%s) is %s, the service %s: an entry's backends must be of its family",
				svc, i, b.Addr, family(ip), family(svc.Addr()))
		case ip.IsUnspecified():
			return nil, invalid("service %s: backend %d (%s): the unspecified address %s cannot be connected to", svc, i, b.Addr, ip)
		case b.Addr.Port() == 0:
			return nil, invalid("service %s: backend %d (%s): port 0, want 1..65535", svc, i, b.Addr)
		case b.Weight < 1 || b.Weight > MaxWeight:
			return nil, invalid("service %s: backend %d (%s): weight %d, want 1..%d", svc, i, b.Addr, b.Weight, MaxWeight)
		}
		addr := netip.AddrPortFrom(ip, b.Addr.Port())
		if j, ok := seen[addr]; ok {
			return nil, invalid("service %s: backend %s is listed twice (%d and %d); give it one entry with the summed weight", svc, addr, j, i)
		}
		seen[addr] = i
		out[i] = Backend{Addr: addr, Weight: b.Weight}
	}
	return out, nil
}
