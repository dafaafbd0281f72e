package redirect

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache/informertest"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/internal/stats"
)

var (
	errForbidden = apierrors.NewForbidden(schema.GroupResource{Group: "sockscale.dev", Resource: "serverlessservices"}, "",
		errors.New(`cannot list resource "serverlessservices" in API group "sockscale.dev" at the cluster scope`))
	errNoKind = &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: "sockscale.dev", Kind: "ServerlessService"}, SearchedVersions: []string{"v1alpha1"}}
)

func syncing(reason string) stats.NodeState {
	return stats.NodeState{SocketRedirect: stats.RedirectSyncing, Reason: reason}
}

var active = stats.NodeState{SocketRedirect: stats.RedirectActive}

// TestStateTimeline drives the state through a start, a failing write, a
// failing watch and its recovery, on an explicit timeline.
func TestStateTimeline(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	r := newReconciler(cacheFactories{}, Options{Map: newFakeMap(), Clock: clk})
	r.routes.set(newStubCache(t), nil) // the Routes are watched
	watchErr := "watch *v1alpha1.ServerlessService: " + errForbidden.Error()
	steps := []struct {
		name string
		do   func()
		want stats.NodeState
	}{
		{"starting", func() {}, syncing(ReasonWaitingForFirstSync)},
		{"first sync fails", func() { r.noteSync(errors.New("read the redirect map: operation not permitted")) },
			syncing("read the redirect map: operation not permitted")},
		{"first sync succeeds", func() { r.noteSync(nil); r.synced.Store(true) }, active},
		{"a write fails", func() { r.noteSync(errors.New("set 10.96.0.10:80: the map is full")) }, syncing("set 10.96.0.10:80: the map is full")},
		{"the retry succeeds", func() { r.noteSync(nil) }, active},
		{"a list is forbidden at t=0", func() { r.watchFailed(context.Background(), reflector("*v1alpha1.ServerlessService"), errForbidden) },
			syncing(watchErr)},
		{"t=59s: the informer may not have retried yet", func() { clk.Step(59 * time.Second); r.noteSync(nil) }, syncing(watchErr)},
		{"t=60s: no watch error for 60 s", func() { clk.Step(time.Second) }, active},
		{"a watch closed by the server is routine", func() {
			r.watchFailed(context.Background(), reflector("*v1.Pod"), apierrors.NewResourceExpired("too old resource version"))
		}, active},
	}
	for _, s := range steps {
		s.do()
		if diff := cmp.Diff(s.want, r.State()); diff != "" {
			t.Errorf("%s: State() (-want +got):\n%s", s.name, diff)
		}
	}
}

func reflector(typeDescription string) *toolscache.Reflector {
	return toolscache.NewReflectorWithOptions(nil, nil, nil, toolscache.ReflectorOptions{TypeDescription: typeDescription})
}

// stubCache is a cache that runs until its ctx ends and has synced once
// synced is closed.
type stubCache struct {
	*informertest.FakeInformers
	synced chan struct{}
}

func newStubCache(t *testing.T) *stubCache {
	scheme := kruntime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := servingv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return &stubCache{FakeInformers: &informertest.FakeInformers{Scheme: scheme}, synced: make(chan struct{})}
}

func (c *stubCache) Start(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

func (c *stubCache) WaitForCacheSync(ctx context.Context) bool {
	select {
	case <-c.synced:
		return true
	case <-ctx.Done():
		return false
	}
}

// runInBackground runs r until the test ends and returns Run's result.
func runInBackground(t *testing.T, r *Reconciler) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var err error
	stopped := false
	stop = func() error {
		if !stopped {
			cancel()
			err, stopped = <-done, true
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// waitState polls r.State() until want holds.
func waitState(t *testing.T, r *Reconciler, what string, want func(stats.NodeState) bool) stats.NodeState {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := r.State()
		if want(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: State() = %+v", what, s)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitForWaiters waits until Run sleeps on the fake clock.
func waitForWaiters(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("Run never waited on the clock")
		}
		time.Sleep(time.Millisecond)
	}
}

// syncedRoutes makes Routes' caches that have synced.
func syncedRoutes(t *testing.T) cacheFactory {
	return func(toolscache.WatchErrorHandlerWithContext) (cache.Cache, error) {
		c := newStubCache(t)
		close(c.synced)
		return c, nil
	}
}

// waitRoutesActive waits until the Routes' watch is active: it waits on
// the clock no more.
func waitRoutesActive(t *testing.T, r *Reconciler) {
	t.Helper()
	waitState(t, r, "the Routes' watch active", func(stats.NodeState) bool { return r.RoutesState() == active })
}

func staleMap() *fakeMap {
	m := newFakeMap()
	m.entries[ap("10.96.0.10:80")] = backends("10.0.0.9:8012")
	return m
}

func (m *fakeMap) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.entries)
}

// TestRunRetriesWatchesThatCannotStart: without the ServerlessService CRD
// the watches cannot start; Run keeps running, clears the map, says
// unavailable, and once the CRD is there a retry makes it active.
func TestRunRetriesWatchesThatCannotStart(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	m := staleMap()
	working := newStubCache(t)
	close(working.synced)
	attempts := 0
	newCache := func(toolscache.WatchErrorHandlerWithContext) (cache.Cache, error) {
		attempts++
		if attempts == 1 {
			missing := newStubCache(t)
			missing.Error = errNoKind
			return missing, nil
		}
		return working, nil
	}
	reg := prometheus.NewRegistry()
	r := newReconciler(cacheFactories{main: newCache, routes: syncedRoutes(t)}, Options{Map: m, Clock: clk, RetryBackoff: 5 * time.Second, Registerer: reg})
	stop := runInBackground(t, r)
	waitRoutesActive(t, r)

	got := waitState(t, r, "unavailable", func(s stats.NodeState) bool { return s.SocketRedirect == stats.RedirectUnavailable })
	if want := `watch *v1alpha1.ServerlessService: no matches for kind "ServerlessService"`; !strings.Contains(got.Reason, want) {
		t.Errorf("reason %q, want it to contain %q", got.Reason, want)
	}
	if n := m.len(); n != 0 {
		t.Errorf("the map holds %d entries while unavailable, want it cleared", n)
	}
	if got := testutil.ToFloat64(r.metrics.entries.WithLabelValues(kindStale)); got != 0 {
		t.Errorf("entries{kind=stale} = %v, want 0", got)
	}
	waitForWaiters(t, clk)
	clk.Step(5 * time.Second)
	waitState(t, r, "active after the retry", func(s stats.NodeState) bool { return s == active })
	if err := stop(); err != nil {
		t.Errorf("Run = %v, want nil when ctx ends", err)
	}
	if attempts != 2 {
		t.Errorf("%d attempts, want 2", attempts)
	}
}

// TestRunClearsTheMapWhenTheCachesDoNotSync: a forbidden list keeps the
// caches from syncing without failing them; past SyncTimeout the map is
// cleared and the state is unavailable with the watch's error, until the
// caches sync after all.
func TestRunClearsTheMapWhenTheCachesDoNotSync(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	m := staleMap()
	c := newStubCache(t)
	var onWatchError toolscache.WatchErrorHandlerWithContext
	newCache := func(h toolscache.WatchErrorHandlerWithContext) (cache.Cache, error) {
		onWatchError = h
		return c, nil
	}
	r := newReconciler(cacheFactories{main: newCache, routes: syncedRoutes(t)}, Options{Map: m, Clock: clk, SyncTimeout: time.Minute})
	stop := runInBackground(t, r)
	waitRoutesActive(t, r)

	waitForWaiters(t, clk)
	onWatchError(context.Background(), reflector("*v1alpha1.ServerlessService"), errForbidden)
	if got := r.State(); got.SocketRedirect != stats.RedirectSyncing || !strings.Contains(got.Reason, "forbidden") {
		t.Errorf("before SyncTimeout: State() = %+v, want syncing, forbidden", got)
	}
	if n := m.len(); n != 1 {
		t.Errorf("before SyncTimeout the map holds %d entries, want the 1 left (it may still be right)", n)
	}
	clk.Step(time.Minute)
	got := waitState(t, r, "unavailable", func(s stats.NodeState) bool { return s.SocketRedirect == stats.RedirectUnavailable })
	if want := "the caches have not synced in 1m0s: watch *v1alpha1.ServerlessService: serverlessservices.sockscale.dev is forbidden"; !strings.HasPrefix(got.Reason, want) {
		t.Errorf("reason %q, want it to start with %q", got.Reason, want)
	}
	if n := m.len(); n != 0 {
		t.Errorf("past SyncTimeout the map holds %d entries, want it cleared", n)
	}
	clk.Step(watchErrorHold) // the informer's retry succeeded: no error since
	close(c.synced)
	waitState(t, r, "active once synced", func(s stats.NodeState) bool { return s == active })
	if err := stop(); err != nil {
		t.Errorf("Run = %v, want nil when ctx ends", err)
	}
}

// TestRunRequiredFails: with Required (--socket-redirect=on) watches that
// cannot start are Run's error, and the map is left alone.
func TestRunRequiredFails(t *testing.T) {
	m := staleMap()
	newCache := func(toolscache.WatchErrorHandlerWithContext) (cache.Cache, error) {
		c := newStubCache(t)
		c.Error = errNoKind
		return c, nil
	}
	r := newReconciler(cacheFactories{main: newCache, routes: syncedRoutes(t)}, Options{Map: m, Required: true})
	err := r.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), `redirect: watch *v1alpha1.ServerlessService: no matches for kind "ServerlessService"`) {
		t.Errorf("Run = %v, want the watch's error", err)
	}
	if n := m.len(); n != 1 {
		t.Errorf("the map holds %d entries, want the 1 left (the agent exits; the next one resyncs)", n)
	}
}

func TestStateMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	state := stats.NodeState{SocketRedirect: stats.RedirectUnavailable, Reason: "watch: forbidden"}
	RegisterStateMetric(reg, func() stats.NodeState { return state })
	want := `
# HELP sockscale_agent_socket_redirect_state How the socket-layer redirect stands on this node: 1 for the current state, 0 for the others, by state: active, syncing, off, unavailable. The agent sends the same state, with its reason, to the controller.
# TYPE sockscale_agent_socket_redirect_state gauge
sockscale_agent_socket_redirect_state{state="active"} 0
sockscale_agent_socket_redirect_state{state="off"} 0
sockscale_agent_socket_redirect_state{state="syncing"} 0
sockscale_agent_socket_redirect_state{state="unavailable"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

var errNoRoute = &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: "serving.sockscale.dev", Kind: "Route"}, SearchedVersions: []string{"v1alpha1"}}

// TestRunKeepsServerlessServicesWithoutRoutes: without the Route CRD the
// ServerlessServices' entries are written as before and the state stays
// active, its reason saying the Routes' entries are unavailable; the
// Routes' watch retries after RetryBackoff and, once the CRD is there,
// both are active.
func TestRunKeepsServerlessServicesWithoutRoutes(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	m := newFakeMap()
	working := newStubCache(t)
	close(working.synced)
	var mu sync.Mutex
	attempts := 0
	routes := func(toolscache.WatchErrorHandlerWithContext) (cache.Cache, error) {
		mu.Lock()
		defer mu.Unlock()
		attempts++
		c := newStubCache(t)
		if attempts == 1 {
			c.Error = errNoRoute
		} else {
			close(c.synced)
		}
		return c, nil
	}
	main := func(toolscache.WatchErrorHandlerWithContext) (cache.Cache, error) { return working, nil }
	reg := prometheus.NewRegistry()
	r := newReconciler(cacheFactories{main: main, routes: routes}, Options{Map: m, Clock: clk, RetryBackoff: 5 * time.Second, Registerer: reg})
	runInBackground(t, r)

	// The reason is read with the state it explains: RoutesState, read
	// apart, can be a step ahead of it.
	got := waitState(t, r, "active without Routes", func(s stats.NodeState) bool {
		return s.SocketRedirect == stats.RedirectActive && strings.Contains(s.Reason, "Route entries unavailable")
	})
	if rs := r.RoutesState(); rs.SocketRedirect != stats.RedirectUnavailable {
		t.Errorf("Routes' state %q, want unavailable", rs.SocketRedirect)
	}
	if want := `ServerlessService entries active; Route entries unavailable: watch *v1alpha1.Route: no matches for kind "Route"`; !strings.HasPrefix(got.Reason, want) {
		t.Errorf("reason %q, want it to start with %q", got.Reason, want)
	}
	if !r.Synced() {
		t.Error("not Synced: the ServerlessServices' entries must not wait for Routes")
	}
	if got := testutil.ToFloat64(r.metrics.skipped.WithLabelValues(KindServerlessService, SkipNoService)); got != 0 {
		t.Errorf("skipped = %v", got)
	}
	clk.Step(4 * time.Second)
	time.Sleep(10 * time.Millisecond)
	mu.Lock()
	if attempts != 1 {
		t.Errorf("%d attempts to watch Routes 4 s after the first, want 1 (the retry is after 5 s)", attempts)
	}
	mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for r.State() != active || r.RoutesState() != active {
		if time.Now().After(deadline) {
			t.Fatalf("State() = %+v, RoutesState() = %+v; want both active after the retry", r.State(), r.RoutesState())
		}
		clk.Step(time.Second)
		time.Sleep(time.Millisecond)
	}
	want := `
# HELP sockscale_agent_redirect_routes_state How the Route entries (traffic splits) stand on this node: 1 for the current state, 0 for the others, by state: active, syncing (starting, or the Routes' watch fails), unavailable (the serving CRDs are missing or Routes are forbidden: no Route address has an entry, the agent retries). ServerlessService entries do not depend on it.
# TYPE sockscale_agent_redirect_routes_state gauge
sockscale_agent_redirect_routes_state{state="active"} 1
sockscale_agent_redirect_routes_state{state="syncing"} 0
sockscale_agent_redirect_routes_state{state="unavailable"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sockscale_agent_redirect_routes_state"); err != nil {
		t.Error(err)
	}
}

// TestRoutesForbidden: a forbidden list of Routes keeps their cache from
// syncing; past SyncTimeout the Routes are unavailable with the watch's
// error (the rest is active), until the cache syncs after all.
func TestRoutesForbidden(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	working := newStubCache(t)
	close(working.synced)
	c := newStubCache(t)
	handlers := make(chan toolscache.WatchErrorHandlerWithContext, 1)
	routes := func(h toolscache.WatchErrorHandlerWithContext) (cache.Cache, error) {
		handlers <- h
		return c, nil
	}
	main := func(toolscache.WatchErrorHandlerWithContext) (cache.Cache, error) { return working, nil }
	r := newReconciler(cacheFactories{main: main, routes: routes}, Options{Map: newFakeMap(), Clock: clk, SyncTimeout: time.Minute})
	runInBackground(t, r)
	onWatchError := <-handlers
	waitState(t, r, "active, Routes syncing", func(s stats.NodeState) bool {
		return s.SocketRedirect == stats.RedirectActive && r.RoutesState() == syncing(ReasonWaitingForRoutes)
	})
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "serving.sockscale.dev", Resource: "routes"}, "", errors.New("cannot list"))
	onWatchError(context.Background(), reflector("*v1alpha1.Route"), forbidden)
	clk.Step(time.Minute)
	got := waitState(t, r, "Routes unavailable", func(stats.NodeState) bool { return r.RoutesState().SocketRedirect == stats.RedirectUnavailable })
	if want := "ServerlessService entries active; Route entries unavailable: the Routes' cache has not synced in 1m0s: watch *v1alpha1.Route: routes.serving.sockscale.dev is forbidden"; !strings.HasPrefix(got.Reason, want) {
		t.Errorf("reason %q, want it to start with %q", got.Reason, want)
	}
	clk.Step(watchErrorHold)
	close(c.synced)
	waitState(t, r, "both active once the Routes synced", func(s stats.NodeState) bool { return s == active && r.RoutesState() == active })
}
