package redirect

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/internal/stats"
)

// ReasonWaitingForRoutes is the reason of the Routes' syncing state
// before their cache's first sync.
const ReasonWaitingForRoutes = "waiting for the first sync of Routes"

// routeWatch is the Routes' watch. It runs beside the other watches, in a
// cache of its own with attempts of its own, so that without the serving
// CRDs (or with RBAC that forbids Routes) the ServerlessServices' entries
// work as before and only the Routes' addresses get none. Its methods are
// safe for concurrent use.
type routeWatch struct {
	mu sync.Mutex
	// cache is the Routes' cache once it synced, nil before and after
	// its attempt failed.
	cache cache.Cache
	// unavailable is why the last attempt failed or has not synced in
	// SyncTimeout; nil once it synced.
	unavailable error
	// watchErr is the last error of the Routes' list or watch, seen at
	// watchErrAt.
	watchErr   error
	watchErrAt time.Time
}

// current is the Routes' cache, nil while they cannot be read.
func (w *routeWatch) current() cache.Cache {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cache
}

func (w *routeWatch) set(c cache.Cache, unavailable error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cache, w.unavailable = c, unavailable
}

// RoutesState says how the Routes' entries stand on this node: active
// (the Routes are watched), syncing (starting, or their watch fails and
// their informer retries), or unavailable (their CRD is missing, or
// listing them is forbidden: no Route address has an entry, and Run
// retries). Safe for concurrent use.
func (r *Reconciler) RoutesState() stats.NodeState {
	w := &r.routes
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.cache == nil && w.unavailable != nil:
		return stats.NodeState{SocketRedirect: stats.RedirectUnavailable, Reason: w.unavailable.Error()}
	case w.cache == nil:
		return stats.NodeState{SocketRedirect: stats.RedirectSyncing, Reason: ReasonWaitingForRoutes}
	case w.watchErr != nil && r.opts.Clock.Since(w.watchErrAt) < watchErrorHold:
		return stats.NodeState{SocketRedirect: stats.RedirectSyncing, Reason: w.watchErr.Error()}
	default:
		return stats.NodeState{SocketRedirect: stats.RedirectActive}
	}
}

// runRoutes watches Routes until ctx ends. An attempt whose watch cannot
// start (no Route CRD) or stops makes the Routes unavailable, and the next
// one follows after RetryBackoff, doubling up to MaxRetryBackoff, as Run's
// attempts do; one that does not sync in SyncTimeout (a forbidden list)
// makes them unavailable while it keeps waiting. Each change asks the
// loop for a sync, which then writes or removes the Routes' entries.
func (r *Reconciler) runRoutes(ctx context.Context) {
	backoff := r.opts.RetryBackoff
	for {
		worked, err := r.attemptRoutes(ctx)
		if ctx.Err() != nil {
			return
		}
		if worked {
			backoff = r.opts.RetryBackoff // not the same failure
		}
		r.opts.Log.Warn("socket-layer redirect of Routes unavailable: their addresses take kube-proxy's path (ServerlessServices are not affected); retrying",
			"err", err, "retryIn", backoff)
		r.routes.set(nil, err)
		r.kickSync()
		select {
		case <-ctx.Done():
			return
		case <-r.opts.Clock.After(backoff):
		}
		backoff = min(2*backoff, MaxRetryBackoff)
	}
}

// The Routes' informer: list and watch.
// +kubebuilder:rbac:groups=serving.sockscale.dev,resources=routes,verbs=list;watch

// attemptRoutes runs one watch of the Routes until ctx ends (nil) or it
// fails; worked says whether it synced.
func (r *Reconciler) attemptRoutes(ctx context.Context) (worked bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops this attempt's informer
	c, err := r.newCache.routes(r.routeWatchFailed)
	if err != nil {
		return false, fmt.Errorf("make the Routes' cache: %w", err)
	}
	route := &servingv1alpha1.Route{}
	inf, err := c.GetInformer(ctx, route)
	if err != nil {
		return false, fmt.Errorf("watch %T: %w", route, err)
	}
	if _, err := inf.AddEventHandler(r.eventHandler()); err != nil {
		return false, fmt.Errorf("watch %T: %w", route, err)
	}
	cacheErr := make(chan error, 1)
	go func() { cacheErr <- c.Start(ctx) }()
	synced := make(chan bool, 1)
	go func() { synced <- c.WaitForCacheSync(ctx) }()
	// A timer, stopped once synced: tests on a fake clock count waiters.
	timer := r.opts.Clock.NewTimer(r.opts.SyncTimeout)
	defer timer.Stop()
	timeout := timer.C()
	for {
		select {
		case <-ctx.Done():
			return worked, nil
		case err := <-cacheErr:
			return worked, watchesStopped(ctx, err)
		case ok := <-synced:
			synced = nil
			if !ok {
				return false, errors.New("the Routes' cache never synced")
			}
			timer.Stop()
			worked, timeout = true, nil
			r.routes.set(c, nil)
			r.opts.Log.Info("socket-layer redirect of Routes: watching Routes")
			r.kickSync()
		case <-timeout:
			timeout = nil
			err := fmt.Errorf("the Routes' cache has not synced in %v", r.opts.SyncTimeout)
			if werr := r.lastRouteWatchError(); werr != nil {
				err = fmt.Errorf("%w: %w", err, werr)
			}
			r.opts.Log.Warn("socket-layer redirect of Routes unavailable until their cache syncs: their addresses take kube-proxy's path (ServerlessServices are not affected)",
				"err", err)
			r.routes.set(nil, err)
			r.kickSync()
		}
	}
}

// routeWatchFailed is the Routes' cache's watch error handler: it notes
// the error for RoutesState and logs it; the informer retries on its own.
func (r *Reconciler) routeWatchFailed(ctx context.Context, refl *toolscache.Reflector, err error) {
	if ctx.Err() != nil || errors.Is(err, io.EOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return // routine, as in watchFailed
	}
	what := "*v1alpha1.Route"
	if refl != nil {
		what = refl.TypeDescription()
	}
	r.opts.Log.Warn("redirect: the Routes' watch failed; its informer retries", "type", what, "err", err)
	w := &r.routes
	w.mu.Lock()
	defer w.mu.Unlock()
	w.watchErr = fmt.Errorf("watch %s: %w", what, err)
	w.watchErrAt = r.opts.Clock.Now()
}

func (r *Reconciler) lastRouteWatchError() error {
	r.routes.mu.Lock()
	defer r.routes.mu.Unlock()
	return r.routes.watchErr
}
