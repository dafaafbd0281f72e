package localroute

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Route is the kernel's answer for one destination.
type Route struct {
	Dst netip.Addr
	// Type is the route's type (unix.RTN_*): RTN_LOCAL for an address of
	// this machine's own, RTN_UNICAST for one reached through Dev.
	Type int
	// Dev is the link the packet leaves through (lo for a local address).
	Dev string
	// Gateway is the next hop, invalid for a directly reached address.
	Gateway netip.Addr
	// Src is the source address the kernel would pick.
	Src netip.Addr
}

// Local says dst is one of this machine's own addresses.
func (r Route) Local() bool { return r.Type == unix.RTN_LOCAL }

// String prints the route as `ip route get` does, e.g.
// "local 10.244.0.1 dev lo src 10.244.0.1".
func (r Route) String() string {
	var b strings.Builder
	switch r.Type {
	case unix.RTN_UNICAST:
	case unix.RTN_LOCAL:
		b.WriteString("local ")
	case unix.RTN_BROADCAST:
		b.WriteString("broadcast ")
	case unix.RTN_MULTICAST:
		b.WriteString("multicast ")
	default:
		fmt.Fprintf(&b, "type %d ", r.Type)
	}
	b.WriteString(r.Dst.String())
	if r.Gateway.IsValid() {
		b.WriteString(" via " + r.Gateway.String())
	}
	b.WriteString(" dev " + r.Dev)
	if r.Src.IsValid() {
		b.WriteString(" src " + r.Src.String())
	}
	return b.String()
}

// Get asks the kernel for its route to dst, in this thread's network
// namespace (the host's, for every thread the runtime schedules freely).
func Get(dst netip.Addr) (Route, error) {
	dst = dst.Unmap()
	routes, err := netlink.RouteGet(net.IP(dst.AsSlice()))
	if err != nil {
		return Route{}, fmt.Errorf("route get %s: %w", dst, err)
	}
	if len(routes) == 0 {
		return Route{}, fmt.Errorf("route get %s: the kernel answered no route", dst)
	}
	nr := routes[0]
	r := Route{Dst: dst, Type: nr.Type}
	r.Gateway, _ = netip.AddrFromSlice(nr.Gw)
	r.Src, _ = netip.AddrFromSlice(nr.Src)
	r.Gateway, r.Src = r.Gateway.Unmap(), r.Src.Unmap()
	link, err := netlink.LinkByIndex(nr.LinkIndex)
	if err != nil {
		return Route{}, fmt.Errorf("route get %s: link %d: %w", dst, nr.LinkIndex, err)
	}
	r.Dev = link.Attrs().Name
	return r, nil
}

// Rule is a route Check accepts.
type Rule struct {
	what string
	ok   func(Route) bool
}

func (r Rule) String() string { return r.what }

// Local accepts a destination that is one of this machine's own addresses,
// whatever device the kernel names (lo).
func Local() Rule {
	return Rule{"a local address", Route.Local}
}

// Loopback accepts a local destination reached through the loopback device
// and nothing else.
func Loopback() Rule {
	return Rule{"local through lo", func(r Route) bool { return r.Local() && r.Dev == "lo" }}
}

// Dev accepts a route through the link named name.
func Dev(name string) Rule {
	return Rule{"through " + name, func(r Route) bool { return r.Dev == name }}
}

// DevPrefix accepts a route through a link whose name starts with prefix.
func DevPrefix(prefix string) Rule {
	return Rule{"through a link named " + prefix + "*", func(r Route) bool { return strings.HasPrefix(r.Dev, prefix) }}
}

// ErrNotLocal is what Check's error wraps when the kernel's route is none
// of the accepted ones.
var ErrNotLocal = errors.New("refusing to send traffic off the machine")

// Check returns nil if one of rules accepts the kernel's route to dst, and
// an error otherwise: the lookup's (no route at all, e.g. unreachable), or
// one wrapping ErrNotLocal that names the route.
func Check(dst netip.Addr, rules ...Rule) error {
	r, err := Get(dst)
	if err != nil {
		return err
	}
	if accepts(r, rules) {
		return nil
	}
	want := make([]string, len(rules))
	for i, rule := range rules {
		want[i] = rule.what
	}
	return fmt.Errorf("route to %s is %q, not %s: %w", dst, r, strings.Join(want, " or "), ErrNotLocal)
}

func accepts(r Route, rules []Rule) bool {
	for _, rule := range rules {
		if rule.ok(r) {
			return true
		}
	}
	return false
}
