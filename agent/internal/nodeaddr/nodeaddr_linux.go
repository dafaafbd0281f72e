//go:build linux

package nodeaddr

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// Run follows the node's addresses (the network namespace the agent runs
// in: the host's) until ctx ends: Set gets them at the start and after each
// change netlink reports. Addresses are re-read whole on each event rather
// than applied one by one, so a lost event (the socket's buffer overflowed,
// which ends the subscription) costs a resubscription and a read, nothing
// more.
//
// A namespace it cannot open (a wrong --node-netns, missing rights) is
// retried every RetryOpen: until then the kernel knows no node address and
// the kubelet's probes count as load, which the error log and OnError say.
func Run(ctx context.Context, o Options) error {
	retry := o.RetryOpen
	if retry <= 0 {
		retry = 10 * time.Second
	}
	for {
		err := open(ctx, o)
		if err == nil || ctx.Err() != nil {
			return nil
		}
		if o.Log != nil {
			o.Log.Error("cannot follow the node's addresses: until then the kubelet's probes count as load", "retryIn", retry, "err", err)
		}
		if o.OnError != nil {
			o.OnError(err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(retry):
		}
	}
}

// open opens the namespace and follows it until ctx ends.
func open(ctx context.Context, o Options) error {
	ns := netns.None()
	if o.Netns != "" {
		var err error
		if ns, err = netns.GetFromPath(o.Netns); err != nil {
			return fmt.Errorf("open the node's network namespace %s: %w", o.Netns, err)
		}
		defer func() { _ = ns.Close() }()
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("open netlink in %s: %w", nsName(o.Netns), err)
	}
	defer h.Close()
	return run(ctx, o, h, ns)
}

func nsName(path string) string {
	if path == "" {
		return "the agent's network namespace"
	}
	return path
}

// run is Run in the network namespace ns (netns.None(): this thread's), with
// h a netlink handle in it.
func run(ctx context.Context, o Options, h *netlink.Handle, ns netns.NsHandle) error {
	events := make(chan struct{}, 1)
	notify := func() {
		select {
		case events <- struct{}{}:
		default:
		}
	}
	first, err := subscribe(ctx, ns)
	if err != nil {
		return err
	}
	go func() {
		updates := first
		for {
			for range updates {
				notify()
			}
			// Closed: ctx ended, or the subscription failed.
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			var err error
			if updates, err = subscribe(ctx, ns); err != nil {
				if o.OnError != nil {
					o.OnError(err)
				}
				closed := make(chan netlink.AddrUpdate)
				close(closed)
				updates = closed // try again in a second
				continue
			}
			notify() // what changed while unsubscribed
		}
	}()
	loop(ctx, o, events, func() ([]netip.Addr, error) { return readAddrs(h) })
	return nil
}

// subscribe returns address changes until ctx ends or the subscription
// fails; the channel is closed then.
func subscribe(ctx context.Context, ns netns.NsHandle) (chan netlink.AddrUpdate, error) {
	updates := make(chan netlink.AddrUpdate, 64)
	if err := netlink.AddrSubscribeWithOptions(updates, ctx.Done(), netlink.AddrSubscribeOptions{Namespace: &ns}); err != nil {
		return nil, fmt.Errorf("subscribe to address changes: %w", err)
	}
	return updates, nil
}

// readAddrs lists the addresses (both families) of the namespace's links, but those of
// excluded links.
func readAddrs(h *netlink.Handle) ([]netip.Addr, error) {
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var out []netip.Addr
	for _, l := range links {
		if excludedLinks[l.Attrs().Name] {
			continue
		}
		addrs, err := h.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("list addresses of %s: %w", l.Attrs().Name, err)
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}
