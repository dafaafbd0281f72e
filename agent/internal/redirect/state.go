package redirect

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/sockscale/sockscale/internal/stats"
)

// ReasonWaitingForFirstSync is the reason of the syncing state while the
// Reconciler starts: the map is not known to follow the cluster yet.
const ReasonWaitingForFirstSync = "waiting for the first sync of ServerlessServices, Services and activator Pods"

// watchErrorHold is how long a watch error keeps the state syncing. A
// reflector retries a failed list or watch with a backoff that settles at
// 30 to 60 s (client-go's defaults), and nothing tells when a retry
// succeeds; holding the error for 60 s keeps a watch that keeps failing
// from flickering to active between its retries, while one that failed
// once is active again a minute later.
const watchErrorHold = 60 * time.Second

// health is what State is computed from; its methods are safe for
// concurrent use (the watches, the loop and the stats reporter use it).
type health struct {
	mu sync.Mutex
	// unavailable is why the watches could not start or never synced;
	// the map was cleared for it. Nil once they synced.
	unavailable error
	// syncErr is the last sync's error, nil after one succeeded.
	syncErr error
	// watchErr is the last error of a list or watch, seen at watchErrAt.
	watchErr   error
	watchErrAt time.Time
}

// State says how the redirect stands on this node, for the controller
// (stats.Batch.NodeState) and the state metric. Safe for concurrent use.
//
// The state is the ServerlessServices' entries': the Routes' entries do
// not make it less than active (a cluster without the serving API has
// none). When they are not active while the rest is, the reason says so,
// e.g. "ServerlessService entries active; Route entries unavailable:
// watch *v1alpha1.Route: no matches for kind "Route" ..."; RoutesState
// has their state alone.
func (r *Reconciler) State() stats.NodeState {
	s := r.serverlessServicesState()
	if s.SocketRedirect != stats.RedirectActive {
		return s
	}
	if rs := r.RoutesState(); rs.SocketRedirect != stats.RedirectActive {
		s.Reason = fmt.Sprintf("ServerlessService entries active; Route entries %s: %s", rs.SocketRedirect, rs.Reason)
	}
	return s
}

// serverlessServicesState is State without the Routes.
func (r *Reconciler) serverlessServicesState() stats.NodeState {
	h := &r.health
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.unavailable != nil:
		return stats.NodeState{SocketRedirect: stats.RedirectUnavailable, Reason: h.unavailable.Error()}
	case h.watchErr != nil && r.opts.Clock.Since(h.watchErrAt) < watchErrorHold:
		// Before the syncs' errors: a failing watch is the likelier
		// cause of the rest.
		return stats.NodeState{SocketRedirect: stats.RedirectSyncing, Reason: h.watchErr.Error()}
	case h.syncErr != nil:
		return stats.NodeState{SocketRedirect: stats.RedirectSyncing, Reason: h.syncErr.Error()}
	case !r.synced.Load():
		return stats.NodeState{SocketRedirect: stats.RedirectSyncing, Reason: ReasonWaitingForFirstSync}
	default:
		return stats.NodeState{SocketRedirect: stats.RedirectActive}
	}
}

// watchFailed is the caches' watch error handler: it notes the error for
// State and logs it; the informer retries on its own.
func (r *Reconciler) watchFailed(ctx context.Context, refl *toolscache.Reflector, err error) {
	// A watch closed by the server or a resource version too old to
	// resume from are routine: the reflector relists at once.
	if ctx.Err() != nil || errors.Is(err, io.EOF) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return
	}
	what := "the API server"
	if refl != nil {
		what = refl.TypeDescription()
	}
	r.opts.Log.Warn("redirect: a watch failed; its informer retries", "type", what, "err", err)
	h := &r.health
	h.mu.Lock()
	defer h.mu.Unlock()
	h.watchErr = fmt.Errorf("watch %s: %w", what, err)
	h.watchErrAt = r.opts.Clock.Now()
}

// lastWatchError returns the last watch error, nil if none.
func (r *Reconciler) lastWatchError() error {
	r.health.mu.Lock()
	defer r.health.mu.Unlock()
	return r.health.watchErr
}

// noteSync records a sync's result for State.
func (r *Reconciler) noteSync(err error) {
	r.health.mu.Lock()
	defer r.health.mu.Unlock()
	r.health.syncErr = err
}

// noteCachesSynced ends an unavailable state: the watches work now.
func (r *Reconciler) noteCachesSynced() {
	r.health.mu.Lock()
	defer r.health.mu.Unlock()
	r.health.unavailable = nil
}

// giveUp marks the redirect unavailable for err and clears the kernel
// map. A stale Proxy entry would keep sending connects to activators that
// may be gone by now, while an empty map is always safe: in Proxy mode the
// public EndpointSlices point at the activators too, only the switch takes
// kube-proxy's path (slower).
func (r *Reconciler) giveUp(err error) {
	r.synced.Store(false)
	r.health.mu.Lock()
	r.health.unavailable = err
	r.health.mu.Unlock()
	if cerr := r.clearMap(); cerr != nil {
		r.opts.Log.Error("redirect: clear the map; the next retry tries again", "err", cerr)
	}
}

// clearMap deletes every entry of the kernel map. Delete keeps the
// redirected counters, so the connects metric stays monotonic; the next
// full resync forgets those of addresses nobody targets.
func (r *Reconciler) clearMap() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applied = nil // unknown until read back, also if this fails
	got, err := r.opts.Map.Entries()
	if err != nil {
		r.metrics.errors.WithLabelValues(stageEntries).Inc()
		return fmt.Errorf("read the redirect map: %w", err)
	}
	var errs []error
	for _, a := range slices.SortedFunc(maps.Keys(got), netip.AddrPort.Compare) {
		if err := r.opts.Map.Delete(a); err != nil {
			r.metrics.updates.WithLabelValues(opDelete, resultError).Inc()
			errs = append(errs, err)
			continue
		}
		r.metrics.updates.WithLabelValues(opDelete, resultOK).Inc()
		delete(got, a)
	}
	r.metrics.setEntries(got, nil)
	if len(errs) == 0 {
		r.applied = got
	}
	return errors.Join(errs...)
}
