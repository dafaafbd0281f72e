// This file: the kernel map's writes. A sync computes the desired state
// and writes the difference from what the map holds, then keeps the
// counters and the latency metric in step.

package redirect

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
)

// sync makes the kernel map equal to the desired state: against the map
// read back from the kernel when full (or when what it holds is unknown),
// else against what was last written.
func (r *Reconciler) sync(ctx context.Context, full bool) error {
	in, err := r.inputs(ctx)
	if err != nil {
		return err
	}
	return r.syncTo(Compute(in), full)
}

// syncTo is sync with the desired state computed.
func (r *Reconciler) syncTo(d Desired, full bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.targets = d.Targets
	r.metrics.setSkipped(d.Skipped)
	if full || r.applied == nil {
		got, err := r.opts.Map.Entries()
		if err != nil {
			r.metrics.errors.WithLabelValues(stageEntries).Inc()
			return fmt.Errorf("read the redirect map: %w", err)
		}
		r.applied = got
	}
	written, errs := r.apply(d)
	if full && len(errs) == 0 {
		// The map equals the cluster as the caches see it.
		if err := r.opts.Map.Renew(max(LeaseTTL, 3*r.opts.ResyncPeriod)); err != nil {
			r.metrics.errors.WithLabelValues(stageLease).Inc()
			errs = append(errs, fmt.Errorf("renew the redirect map's lease: %w", err))
		}
	}
	if full {
		errs = append(errs, r.forgetCounters(d))
	}
	r.metrics.setEntries(r.applied, d.Entries)
	r.observeLatencies(written)
	return errors.Join(errs...)
}

// apply writes the difference between r.applied and d.Entries, and returns
// the targets whose entries it changed (all writes succeeded) or failed to
// change.
func (r *Reconciler) apply(d Desired) (map[Target]bool, []error) {
	written := make(map[Target]bool)
	var errs []error
	note := func(key Target, op string, err error) {
		if err != nil {
			r.metrics.updates.WithLabelValues(op, resultError).Inc()
			errs = append(errs, err)
			written[key] = false
			return
		}
		r.metrics.updates.WithLabelValues(op, resultOK).Inc()
		if _, noted := written[key]; !noted {
			written[key] = true // a failure noted before stays false
		}
	}
	applied := r.applied
	// Sorted, so a log of the writes reads the same every time.
	for _, a := range slices.SortedFunc(maps.Keys(applied), netip.AddrPort.Compare) {
		if _, ok := d.Entries[a]; ok {
			continue
		}
		var err error
		if _, known := d.Targets[a]; known {
			err = r.opts.Map.Delete(a) // the Service stays: keep its counter
		} else {
			err = r.opts.Map.Forget(a) // nobody's Service: drop the counter too
		}
		if err == nil {
			delete(applied, a)
			r.opts.Log.Debug("redirect removed", "service", a, "target", d.Targets[a])
		}
		note(d.Targets[a], opDelete, err)
	}
	for _, a := range slices.SortedFunc(maps.Keys(d.Entries), netip.AddrPort.Compare) {
		e := d.Entries[a]
		if slices.Equal(applied[a], e.Backends) {
			continue
		}
		err := r.opts.Map.Set(a, e.Backends)
		if err == nil {
			applied[a] = e.Backends
			r.opts.Log.Debug("redirect set", "service", a, "target", e.Target, "backends", len(e.Backends))
		}
		note(e.Target, opSet, err)
	}
	if len(errs) > 0 {
		// A failed write leaves its entry unknown: read the map back
		// next time.
		r.applied = nil
	}
	return written, errs
}

// forgetCounters drops the redirected counters of addresses that are no
// target's any more (their entries are gone already), so the counter map
// does not fill with deleted Services.
func (r *Reconciler) forgetCounters(d Desired) error {
	counts, err := r.opts.Map.Redirected()
	if err != nil {
		r.metrics.errors.WithLabelValues(stageCounters).Inc()
		return fmt.Errorf("read the redirected counters: %w", err)
	}
	var errs []error
	for a := range counts {
		_, known := d.Targets[a]
		_, entry := d.Entries[a]
		if known || entry {
			continue
		}
		if err := r.opts.Map.Forget(a); err != nil {
			r.metrics.errors.WithLabelValues(stageForget).Inc()
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// observeLatencies records, for each ServerlessService whose status change
// was seen, how long until its entries were written; a change that needed
// no write is dropped, one whose write failed waits for the retry.
func (r *Reconciler) observeLatencies(written map[Target]bool) {
	now := r.opts.Clock.Now()
	for key, seen := range r.observed {
		ok, wrote := written[sksTarget(key)]
		switch {
		case !wrote:
			delete(r.observed, key)
		case ok:
			r.metrics.latency.Observe(now.Sub(seen).Seconds())
			delete(r.observed, key)
		}
	}
}

func (r *Reconciler) entryCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.applied)
}

// counters returns the redirected connects per address and the target of
// each, for the metrics.
func (r *Reconciler) counters() (map[netip.AddrPort]uint64, map[netip.AddrPort]Target, error) {
	counts, err := r.opts.Map.Redirected()
	r.mu.Lock()
	defer r.mu.Unlock()
	return counts, r.targets, err
}
