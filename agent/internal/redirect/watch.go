// This file: the watch lifecycle. Run starts the caches (retrying while
// they cannot), waits for their first sync, and turns their events and
// the resync ticks into syncs.

package redirect

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

// Run watches until ctx ends. Once the caches are filled it resyncs the
// kernel map (retrying every second until that succeeds), then follows
// events and resyncs every ResyncPeriod. Stopping leaves the map as it is:
// its entries keep redirecting, and the next agent resyncs them.
//
// When the watches cannot start (a missing CRD), stop, or have not synced
// within SyncTimeout (a forbidden list), Run returns the error if
// Options.Required; otherwise it clears the map, State says unavailable,
// and it tries again after RetryBackoff, doubling up to MaxRetryBackoff.
//
// The Routes' watch runs beside, with attempts of its own (runRoutes).
func (r *Reconciler) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	var routes sync.WaitGroup
	defer routes.Wait()
	defer cancel() // before the Wait: it ends the Routes' watch
	routes.Go(func() { r.runRoutes(ctx) })
	backoff := r.opts.RetryBackoff
	for {
		err := r.attempt(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if r.opts.Required {
			return fmt.Errorf("redirect: %w", err)
		}
		if r.Synced() {
			backoff = r.opts.RetryBackoff // it worked for a while: not the same failure
		}
		r.opts.Log.Warn("socket-layer redirect unavailable: its map is cleared and Proxy mode goes through the public EndpointSlices (kube-proxy) only; retrying. --socket-redirect=on makes this fatal",
			"err", err, "retryIn", backoff)
		r.giveUp(err)
		select {
		case <-ctx.Done():
			return nil
		case <-r.opts.Clock.After(backoff):
		}
		backoff = min(2*backoff, MaxRetryBackoff)
	}
}

// The attempt's informers: list and watch; Get and List read the cache.
// +kubebuilder:rbac:groups=sockscale.dev,resources=serverlessservices,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=services,verbs=list;watch
// +kubebuilder:rbac:groups="",resources=pods,verbs=list;watch

// attempt runs one set of watches until ctx ends (nil) or they fail.
func (r *Reconciler) attempt(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops this attempt's informers
	r.synced.Store(false)
	c, err := r.newCache.main(r.watchFailed)
	if err != nil {
		return fmt.Errorf("make the cache: %w", err)
	}
	r.cache = c
	for _, obj := range []client.Object{&v1alpha1.ServerlessService{}, &corev1.Service{}, &corev1.Pod{}} {
		inf, err := c.GetInformer(ctx, obj)
		if err != nil {
			return fmt.Errorf("watch %T: %w", obj, err)
		}
		if _, err := inf.AddEventHandler(r.eventHandler()); err != nil {
			return fmt.Errorf("watch %T: %w", obj, err)
		}
	}
	cacheErr := make(chan error, 1)
	go func() { cacheErr <- c.Start(ctx) }()
	if err := r.waitForCaches(ctx, cacheErr); err != nil || ctx.Err() != nil {
		return err
	}
	r.noteCachesSynced()
	clk := r.opts.Clock
	// Until the first resync has read the pinned map back, entries an
	// earlier agent left may be stale: keep trying.
	for {
		err := r.sync(ctx, true)
		r.noteSync(err)
		if err == nil {
			break
		}
		r.opts.Log.Warn("first sync of the redirect map; retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-clk.After(retryAfter):
		}
	}
	r.synced.Store(true)
	r.opts.Log.Info("redirect map in sync", "entries", r.entryCount())
	tick := clk.NewTicker(r.opts.ResyncPeriod)
	defer tick.Stop()
	var retry <-chan time.Time
	for {
		full := false
		select {
		case <-ctx.Done():
			return nil
		case err := <-cacheErr:
			return watchesStopped(ctx, err)
		case <-r.kick:
		case <-tick.C():
			full = true
		case <-retry:
			full = true
		}
		retry = nil
		err := r.sync(ctx, full)
		r.noteSync(err)
		if err != nil {
			r.opts.Log.Warn("sync the redirect map; retrying", "err", err)
			retry = clk.After(retryAfter)
		}
	}
}

// waitForCaches waits for the caches' first sync. Past SyncTimeout
// without it, the map is cleared (or, if Required, that is an error) and
// the wait goes on: the informers retry their lists on their own, so a
// permission granted later is picked up without a new attempt.
func (r *Reconciler) waitForCaches(ctx context.Context, cacheErr <-chan error) error {
	synced := make(chan bool, 1)
	go func() { synced <- r.cache.WaitForCacheSync(ctx) }()
	timeout := r.opts.Clock.After(r.opts.SyncTimeout)
	for {
		select {
		case ok := <-synced:
			if ok || ctx.Err() != nil {
				return nil
			}
			return errors.New("the caches never synced")
		case err := <-cacheErr:
			return watchesStopped(ctx, err)
		case <-timeout:
			timeout = nil
			err := fmt.Errorf("the caches have not synced in %v", r.opts.SyncTimeout)
			if werr := r.lastWatchError(); werr != nil {
				err = fmt.Errorf("%w: %w", err, werr)
			}
			if r.opts.Required {
				return err
			}
			r.opts.Log.Warn("socket-layer redirect unavailable: its map is cleared until the caches sync; Proxy mode goes through the public EndpointSlices (kube-proxy) only",
				"err", err)
			r.giveUp(err)
		}
	}
}

// watchesStopped is the error of a cache that returned: none if ctx ended
// (the cache may return before the caller's select sees ctx.Done).
func watchesStopped(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return nil
	case err == nil:
		return errors.New("the watches stopped")
	default:
		return fmt.Errorf("the watches stopped: %w", err)
	}
}

// eventHandler calls event on every change of a watched object.
func (r *Reconciler) eventHandler() toolscache.ResourceEventHandler {
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { r.event(nil, o) },
		UpdateFunc: func(old, o any) { r.event(old, o) },
		DeleteFunc: func(o any) { r.event(nil, o) },
	}
}

// event notes a ServerlessService's status change (for the latency metric)
// and asks for a sync.
func (r *Reconciler) event(old, obj any) {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if sks, ok := obj.(*v1alpha1.ServerlessService); ok && r.synced.Load() {
		prev, _ := old.(*v1alpha1.ServerlessService)
		if prev == nil || statusChanged(prev, sks) {
			key := types.NamespacedName{Namespace: sks.Namespace, Name: sks.Name}
			r.mu.Lock()
			if _, ok := r.observed[key]; !ok {
				r.observed[key] = r.opts.Clock.Now()
			}
			r.mu.Unlock()
		}
	}
	r.kickSync()
}

// kickSync asks the loop for a sync.
func (r *Reconciler) kickSync() {
	select {
	case r.kick <- struct{}{}:
	default: // a sync is pending already; it will see this change
	}
}

// statusChanged says whether the parts of the status that Compute reads
// changed.
func statusChanged(a, b *v1alpha1.ServerlessService) bool {
	return a.Status.Mode != b.Status.Mode || !slices.Equal(a.Status.Activators, b.Status.Activators) ||
		!equality.Semantic.DeepEqual(a.Status.Conditions, b.Status.Conditions)
}
