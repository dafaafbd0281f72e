package nodeaddr

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"time"
)

// Options configure a Watcher.
type Options struct {
	// Netns is the path of the node's network namespace (e.g.
	// /proc/1/ns/net, with the host's PIDs); empty: the caller's own.
	Netns string
	// Set receives the node's addresses each time they change (and once at
	// the start): the whole set, sorted.
	Set func([]netip.Addr) error
	// Resync is how often the addresses are read again even without an
	// event (a lost event: the netlink socket's buffer overflowed).
	// Default 1 minute.
	Resync time.Duration
	// RetryOpen is how often a namespace that cannot be opened is tried
	// again. Default 10 s.
	RetryOpen time.Duration
	// Settle is how long to wait after an event for more before reading
	// the addresses (an interface coming up brings several). Default 100 ms.
	Settle time.Duration
	Log    *slog.Logger
	// OnError, if set, is called with each failure to read or set the
	// addresses (a metric); the watcher retries at the next event or
	// resync.
	OnError func(error)
}

// excludedLinks hold addresses that are not where the node's own
// connections come from: kube-proxy's IPVS mode gives every Service's
// cluster IP to kube-ipvs0 (thousands of them on a large cluster).
var excludedLinks = map[string]bool{"kube-ipvs0": true}

// usable says whether a is an address the node's connections to pods can
// come from, of either family: not loopback (a connection to a pod never
// leaves from 127/8 or ::1), not link-local (a probe of a pod's address
// leaves from the node's address on the pod's network) and not multicast.
func usable(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsValid() && !a.IsLoopback() && !a.IsLinkLocalUnicast() && !a.IsUnspecified() && !a.IsMulticast()
}

// normalise sorts and dedups a set of addresses, dropping unusable ones.
func normalise(addrs []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if usable(a) {
			out = append(out, a.Unmap())
		}
	}
	slices.SortFunc(out, func(x, y netip.Addr) int { return x.Compare(y) })
	return slices.Compact(out)
}

func (o *Options) defaults() {
	if o.Resync <= 0 {
		o.Resync = time.Minute
	}
	if o.Settle <= 0 {
		o.Settle = 100 * time.Millisecond
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.OnError == nil {
		o.OnError = func(error) {}
	}
}

// apply reads the addresses with read and hands them to Set if they
// differ from last; returns what the kernel now has.
func apply(o *Options, read func() ([]netip.Addr, error), last []netip.Addr) []netip.Addr {
	addrs, err := read()
	if err != nil {
		o.Log.Error("reading the node's addresses failed; retrying at the next change or resync", "err", err)
		o.OnError(err)
		return last
	}
	addrs = normalise(addrs)
	if last != nil && slices.Equal(addrs, last) {
		return last
	}
	if err := o.Set(addrs); err != nil {
		o.Log.Error("setting the node's addresses in the kernel failed; retrying at the next change or resync", "addresses", len(addrs), "err", err)
		o.OnError(err)
		return nil // unknown: set again next time
	}
	o.Log.Info("node addresses", "addresses", addrs)
	return addrs
}

// loop runs until ctx ends: the addresses once, then again Settle after
// each event and every Resync.
func loop(ctx context.Context, o Options, events <-chan struct{}, read func() ([]netip.Addr, error)) {
	o.defaults()
	last := apply(&o, read, nil)
	resync := time.NewTicker(o.Resync)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-resync.C:
		case <-events:
			settle := time.NewTimer(o.Settle)
		drain:
			for {
				select {
				case <-ctx.Done():
					settle.Stop()
					return
				case <-events:
				case <-settle.C:
					break drain
				}
			}
		}
		last = apply(&o, read, last)
	}
}
