package e2e

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/test/cluster"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// TestE2EContainerConcurrencyIsAHardLimit: targets with
// containerConcurrency 1 and 3 (utilization 100 %, so a pod's target is
// its limit; target burst capacity 0, which sends any other target's
// traffic straight to its pods once it has one) under 20 clients, half in a pod on a node (the kernel's
// connect-time redirect) and half outside the nodes (kube-proxy), each
// half keep-alive and new-connection: through scale-up, a steady state and
// a scale-down to 10 clients, no pod ever has more requests in flight than
// its containerConcurrency (the test app says in every answer how many it
// had), no request fails, and the target scales to ceil(clients / CC)
// pods. The activators stay in the path (ModeReason ContainerConcurrency):
// they alone keep a pod within its limit.
func TestE2EContainerConcurrencyIsAHardLimit(t *testing.T) {
	s := up(t)
	var wg sync.WaitGroup
	for _, cc := range []int32{1, 3} {
		name := fmt.Sprintf("cc%d", cc)
		url := deploy(t, s, name, func(p *v1alpha1.PodAutoscalerSpec) {
			p.ContainerConcurrency, p.TargetUtilizationPercentage, p.MaxScale = cc, ptr.To(100.0), ptr.To(int32(25))
			p.TargetBurstCapacity = ptr.To(0.0)
		})
		removeAtEnd(t, s, name)
		// The two targets side by side, each checked on its own.
		wg.Go(func() {
			t.Run(name, func(t *testing.T) { hardLimit(t, s, url, name, cc) })
		})
	}
	wg.Wait()
}

// hardLimit runs the load of TestE2EContainerConcurrencyIsAHardLimit on
// one target.
func hardLimit(t *testing.T, s *stack.Stack, url, name string, cc int32) {
	ctx := context.Background()
	svc := netip.MustParseAddrPort(strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/"))
	localRoute(t, svc.Addr())
	const clients, fewer = 20, 10
	pods := func(n int) int32 { return int32(math.Ceil(float64(n) / float64(cc))) }
	in := startInNodeClientAs(t, s, name+"-client", cluster.NodeName(0), innodeConfig{
		Addr: svc, KeepAlive: clients / 4, NewConn: clients / 4, Recycle: 20, Query: "?sleep=200", ProbeEvery: time.Second,
	})
	out := startLoadWithInFlight(ctx, url+"?sleep=200", clients/4, clients/4)
	start := time.Now()
	path := watchPath(t, s, name, start)
	var most int32
	watch := func(want int32, what string) {
		e2etest.Eventually(t, 2*time.Minute, fmt.Sprintf("%s: %d pods wanted and ready", what, want), func() error {
			d, err := s.Deployment(ctx, appNS, name)
			if err != nil {
				return err
			}
			most = max(most, *d.Spec.Replicas)
			if *d.Spec.Replicas != want || d.Status.ReadyReplicas != want {
				return fmt.Errorf("%d wanted, %d ready: %s", *d.Spec.Replicas, d.Status.ReadyReplicas, paLine(t, s, name))
			}
			return nil
		})
		t.Logf("%s after %s: %s", what, time.Since(start).Round(time.Second), paLine(t, s, name))
	}
	watch(pods(clients), fmt.Sprintf("%d clients", clients))
	pa, err := s.PA(ctx, appNS, name)
	if err != nil {
		t.Fatal(err)
	}
	if pa.Status.Mode != v1alpha1.ModeProxy || pa.Status.ModeReason != "ContainerConcurrency" {
		t.Errorf("at steady load: mode %s because %q, want Proxy because ContainerConcurrency", pa.Status.Mode, pa.Status.ModeReason)
	}
	for range 10 { // steady
		time.Sleep(time.Second)
		if got := replicas(t, s, name); got != pods(clients) {
			t.Errorf("at steady load: %d pods wanted, want %d: %s", got, pods(clients), paLine(t, s, name))
		}
	}
	outside := out.stop()
	watch(pods(fewer), fmt.Sprintf("%d clients", fewer))
	loads := in.stop(t)
	// The activators in the target's path and the ready ones, as they
	// changed: a pod over its limit is most often two activators both
	// sending to it across a change of the path.
	for _, line := range path() {
		t.Log(line)
	}

	if most > pods(clients) {
		t.Errorf("%d pods wanted at most, want at most ceil(%d / %d) = %d", most, clients, cc, pods(clients))
	}
	for _, l := range append(loads, outside...) {
		t.Logf("%s clients: %d completed, %d failed, p50 %s p99 %s; at most %d in flight at a pod",
			l.Kind, l.Completed, l.Failed, l.P50, l.P99, l.MaxInFlight)
		if l.Failed > 0 {
			t.Errorf("%s clients: %d of %d requests failed, e.g. %+v", l.Kind, l.Failed, l.Completed+l.Failed, l.Failures)
		}
		if l.Completed == 0 {
			t.Errorf("%s clients: no request completed", l.Kind)
		}
		if l.MaxInFlight > int64(cc) {
			t.Errorf("%s clients: a pod had %d requests in flight at once, more than its containerConcurrency %d", l.Kind, l.MaxInFlight, cc)
		}
	}
}

// watchPath polls the target's ServerlessService (the activators in its
// path) and the activator pods (which are ready) until the test ends, and
// returns a func that gives the changes seen so far, timed from start.
func watchPath(t *testing.T, s *stack.Stack, name string, start time.Time) func() []string {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var lines []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := ""
		for ctx.Err() == nil {
			var sks v1alpha1.ServerlessService
			now := ""
			if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: name}, &sks); err == nil {
				now = fmt.Sprintf("mode %s path %v", sks.Status.Mode, sks.Status.Activators)
			}
			if acts, err := s.Activators(ctx); err == nil {
				for _, a := range acts {
					now += fmt.Sprintf(" %s ready=%t deleting=%t", a.Name, a.Ready, a.Deleting)
				}
			}
			if now != last {
				mu.Lock()
				lines = append(lines, fmt.Sprintf("path at %s: %s", time.Since(start).Round(10*time.Millisecond), now))
				mu.Unlock()
				last = now
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(lines)
	}
}

// outsideLoad is a load from the test process (on no node: kube-proxy
// alone routes it) that keeps the most in flight any answer reported.
type outsideLoad struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	res    [2]loadResult
	took   [2][]time.Duration
}

// startLoadWithInFlight runs keepAlive clients reusing their connection
// and newConn clients dialling for every request, each a closed loop of
// GET url.
func startLoadWithInFlight(ctx context.Context, url string, keepAlive, newConn int) *outsideLoad {
	ctx, cancel := context.WithCancel(ctx)
	l := &outsideLoad{cancel: cancel}
	l.res[0] = loadResult{Kind: "outside keep-alive", Clients: keepAlive}
	l.res[1] = loadResult{Kind: "outside new-connection", Clients: newConn}
	for kind, n := range []int{keepAlive, newConn} {
		for range n {
			l.wg.Go(func() {
				c := &http.Client{Transport: &http.Transport{DisableKeepAlives: kind == 1, MaxIdleConnsPerHost: 1, Proxy: nil}, Timeout: loadTimeout}
				defer c.CloseIdleConnections()
				for ctx.Err() == nil {
					// Not cancelled by ctx: a request in flight at the end
					// finishes and counts.
					req, _ := http.NewRequest(http.MethodGet, url, nil)
					at := time.Now()
					inFlight, err := getOK(c, req)
					l.mu.Lock()
					l.took[kind] = append(l.took[kind], time.Since(at))
					l.res[kind].MaxInFlight = max(l.res[kind].MaxInFlight, inFlight)
					if err != nil {
						l.res[kind].Failed++
						if len(l.res[kind].Failures) < 3 {
							l.res[kind].Failures = append(l.res[kind].Failures, loadFailure{At: time.Now(), Err: err.Error()})
						}
					} else {
						l.res[kind].Completed++
					}
					l.mu.Unlock()
				}
			})
		}
	}
	return l
}

// stop ends the load (requests in flight finish) and returns its results.
func (l *outsideLoad) stop() []loadResult {
	l.cancel()
	l.wg.Wait()
	for i := range l.res {
		l.res[i].P50, l.res[i].P99 = pct(l.took[i], 0.5), pct(l.took[i], 0.99)
	}
	return l.res[:]
}
