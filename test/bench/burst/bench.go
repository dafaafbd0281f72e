package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/internal/testutil/localroute"
	"github.com/sockscale/sockscale/test/cluster"
	"github.com/sockscale/sockscale/test/stack"
)

const (
	appNS = "burst"
	// The targets' PodAutoscaler: 10 in flight per pod at the default 70 %
	// utilization, so 7 per pod; up to 30 pods.
	targetValue = 10.0
	perPod      = 7.0
	maxScale    = 30
)

// Scenarios, the table's rows per target.
const (
	scSteady = "steady"
	scBurst  = "burst"
	scZero   = "at zero"
)

// target is one PodAutoscaler of the run: one TBC, one client kind.
type target struct {
	name string
	tbc  float64
	kind clientKind
	url  string
	// client carries the target's loads from one phase to the next, so
	// keep-alive connections live on as a real client's would: one opened
	// while the target was in Proxy mode stays with its activator.
	client *http.Client
}

// row is one scenario's numbers.
type row struct {
	tbc      float64
	kind     clientKind
	scenario string
	res      *loadgen.Result
	elapsed  time.Duration
	// cold are the latencies of the requests sent at zero (each client's
	// first), for the at-zero rows.
	cold *loadgen.Result
	pods int32
	// via is what the activators forwarded of the target's requests in
	// the window.
	via   float64
	proxy time.Duration
	note  string
}

func targetName(tbc float64, kind clientKind) string {
	v := strings.NewReplacer("-", "m", ".", "-").Replace(strconv.FormatFloat(tbc, 'f', -1, 64))
	k := "ka"
	if kind == newConn {
		k = "nc"
	}
	return "tbc" + v + "-" + k
}

// measure runs every target's warm scenarios (burst, then steady) one
// after the other, then every target's scenario at zero: by then each
// has long been idle and at zero, so the wait for the scale to zero
// overlaps the other targets' measurements. Only one target has load at a
// time: on 2 cores two loads would share the CPU and each other's numbers.
func measure(ctx context.Context, c *cluster.Cluster, s *stack.Stack, f *flags, say func(string, ...any)) ([]row, error) {
	wc, err := client.NewWithWatch(c.Config, client.Options{Scheme: s.Client.Scheme()})
	if err != nil {
		return nil, fmt.Errorf("watch client: %w", err)
	}
	tl := newTimeline(os.Stderr)
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go tl.follow(wctx, wc, &v1alpha1.ServerlessServiceList{}, appNS)
	go tl.follow(wctx, wc, &appsv1.DeploymentList{}, appNS)

	var targets []*target
	for _, tbc := range f.tbcs {
		for _, k := range f.kinds {
			targets = append(targets, &target{name: targetName(tbc, k), tbc: tbc, kind: k})
		}
	}
	var rows []row
	for _, t := range targets {
		rs, err := warm(ctx, s, tl, f, t, say)
		rows = append(rows, rs...)
		if err != nil {
			return rows, fmt.Errorf("target %s: %w", t.name, err)
		}
	}
	for _, t := range targets {
		r, err := atZero(ctx, s, tl, f, t, say)
		if err != nil {
			return rows, fmt.Errorf("target %s at zero: %w", t.name, err)
		}
		rows = append(rows, r)
	}
	if n := tl.failures(); n > 0 {
		say("the watches failed %d times: Proxy times and pods may miss changes", n)
	}
	return rows, nil
}

// warm deploys t, holds 1 request in flight, bursts to f.burst within a
// second (one row), then drops to f.steady and measures it once the pods
// settled (another row); then the target is left idle.
func warm(ctx context.Context, s *stack.Stack, tl *timeline, f *flags, t *target, say func(string, ...any)) ([]row, error) {
	say("%s: deploying (TBC %v, %s clients, target %v, max-scale %d)", t.name, t.tbc, t.kind, targetValue, maxScale)
	if err := s.Deploy(ctx, stack.App{Namespace: appNS, Name: t.name, Spec: func(p *v1alpha1.PodAutoscalerSpec) {
		p.Target, p.MinScale, p.MaxScale = ptr.To(targetValue), ptr.To(int32(0)), ptr.To(int32(maxScale))
		p.TargetBurstCapacity = ptr.To(t.tbc)
	}}); err != nil {
		return nil, fmt.Errorf("deploy: %w", err)
	}
	if err := waitAnswers(ctx, s, t); err != nil {
		return nil, err
	}
	t.client = loadgen.NewClient(f.burst, t.kind == keepAlive)
	defer t.client.CloseIdleConnections()
	u := fmt.Sprintf("%s?sleep=%dms", t.url, f.sleep.Milliseconds())
	opts := func(n int) loadgen.Options {
		return loadgen.Options{URLs: []string{u}, Concurrency: n, KeepAlive: t.kind == keepAlive, Client: t.client}
	}

	// 1 in flight long enough for the windows to hold it: the panic
	// window (10 % of 20 s) several times over.
	pre := loadgen.Start(ctx, opts(1))
	if err := sleep(ctx, 6*time.Second); err != nil {
		pre.Stop()
		return nil, err
	}
	if r := pre.Stop(); r.Failed > 0 {
		say("%s: %d of %d requests at 1 in flight failed: %v", t.name, r.Failed, r.Completed+r.Failed, r.FirstError)
	}

	// The burst: 1 client at once, the others in 10 steps over a second.
	before, err := forwarded(ctx, s, t.name)
	if err != nil {
		return nil, err
	}
	from := time.Now()
	loads := []*loadgen.Load{loadgen.Start(ctx, opts(1))}
	for i := range 10 {
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			stopAll(loads)
			return nil, err
		}
		if n := (f.burst-1)*(i+1)/10 - (f.burst-1)*i/10; n > 0 {
			loads = append(loads, loadgen.Start(ctx, opts(n)))
		}
	}
	if err := sleep(ctx, time.Until(from.Add(f.burstFor))); err != nil {
		stopAll(loads)
		return nil, err
	}
	res := stopAll(loads)
	to := time.Now()
	after, err := forwarded(ctx, s, t.name)
	if err != nil {
		return nil, err
	}
	burst := row{tbc: t.tbc, kind: t.kind, scenario: scBurst, res: res, elapsed: to.Sub(from),
		pods: tl.maxReady(t.name, from, to), via: after - before, proxy: tl.proxyTime(t.name, from, to)}
	say("%s: burst %s", t.name, burst.summary())

	// Down to the steady load; measured once the pods have settled.
	settle := loadgen.Start(ctx, opts(f.steady))
	want := int32(math.Ceil(float64(f.steady) / perPod))
	pods, serr := waitSettled(ctx, s, t.name, want, f.settleTimeout)
	if r := settle.Stop(); r.Failed > 0 {
		say("%s: %d of %d requests failed while settling: %v", t.name, r.Failed, r.Completed+r.Failed, r.FirstError)
	}
	if serr != nil && ctx.Err() != nil {
		return []row{burst}, serr
	}
	steady := row{tbc: t.tbc, kind: t.kind, scenario: scSteady}
	if serr != nil {
		steady.note = fmt.Sprintf("not settled: %v", serr)
		say("%s: %s, measured anyway", t.name, steady.note)
	} else {
		say("%s: settled at %d pods", t.name, pods)
	}
	if before, err = forwarded(ctx, s, t.name); err != nil {
		return []row{burst}, err
	}
	from = time.Now()
	l := loadgen.Start(ctx, opts(f.steady))
	err = sleep(ctx, f.steadyFor)
	steady.res = l.Stop()
	to = time.Now()
	if err != nil {
		return []row{burst}, err
	}
	if after, err = forwarded(ctx, s, t.name); err != nil {
		return []row{burst}, err
	}
	steady.elapsed, steady.via = to.Sub(from), after-before
	steady.pods, steady.proxy = tl.maxReady(t.name, from, to), tl.proxyTime(t.name, from, to)
	say("%s: steady %s", t.name, steady.summary())
	return []row{steady, burst}, nil
}

// atZero waits for t to be at zero (no pod, Proxy mode), then f.burst
// clients arrive at once on connections of their own and keep going for
// f.zeroFor.
func atZero(ctx context.Context, s *stack.Stack, tl *timeline, f *flags, t *target, say func(string, ...any)) (row, error) {
	r := row{tbc: t.tbc, kind: t.kind, scenario: scZero}
	if err := waitZero(ctx, s, tl, t.name, 3*time.Minute); err != nil {
		return r, err
	}
	before, err := forwarded(ctx, s, t.name)
	if err != nil {
		return r, err
	}
	// Clients that arrive: a client of their own, no connection from
	// the warm scenarios.
	u := fmt.Sprintf("%s?sleep=%dms", t.url, f.sleep.Milliseconds())
	from := time.Now()
	l := loadgen.Start(ctx, loadgen.Options{URLs: []string{u}, Concurrency: f.burst, KeepAlive: t.kind == keepAlive, Spans: true})
	err = sleep(ctx, f.zeroFor)
	r.res = l.Stop()
	to := time.Now()
	if err != nil {
		return r, err
	}
	after, err := forwarded(ctx, s, t.name)
	if err != nil {
		return r, err
	}
	r.elapsed, r.via = to.Sub(from), after-before
	r.pods, r.proxy = tl.maxReady(t.name, from, to), tl.proxyTime(t.name, from, to)
	r.cold = firstRequests(r.res, from)
	say("%s: at zero %s", t.name, r.summary())
	return r, nil
}

// firstRequests are the requests a result's clients started at once at
// from: each client's first (the next starts only after an answer, which
// takes the app's sleep and, at zero, a pod's start).
func firstRequests(res *loadgen.Result, from time.Time) *loadgen.Result {
	cold := &loadgen.Result{}
	// Latencies and Spans are appended together, per successful request.
	for i, lat := range res.Latencies {
		if i < len(res.Spans) && res.Spans[i].End.Add(-lat).Before(from.Add(200*time.Millisecond)) {
			cold.Latencies = append(cold.Latencies, lat)
		}
	}
	return cold
}

// stopAll stops the loads and merges their results.
func stopAll(loads []*loadgen.Load) *loadgen.Result {
	sum := &loadgen.Result{}
	for _, l := range loads {
		r := l.Stop()
		sum.Completed += r.Completed
		sum.Failed += r.Failed
		if sum.FirstError == nil {
			sum.FirstError = r.FirstError
		}
		sum.Latencies = append(sum.Latencies, r.Latencies...)
		sum.Elapsed = max(sum.Elapsed, r.Elapsed)
	}
	return sum
}

// forwarded is what the activators have forwarded of the target's
// requests: slots handed out, less those given back because the pod
// could not be reached (the request then went to another pod).
func forwarded(ctx context.Context, s *stack.Stack, name string) (float64, error) {
	acts, err := s.Activators(ctx)
	if err != nil {
		return 0, fmt.Errorf("list activators: %w", err)
	}
	var sum float64
	for _, a := range acts {
		if !a.IP.IsValid() {
			continue
		}
		m, err := s.Scrape(ctx, a.IP, stack.ActivatorMetricsPort)
		if err != nil {
			return 0, fmt.Errorf("scrape activator %s: %w", a.Name, err)
		}
		of := func(result string) float64 {
			return stack.Sum(m, "sockscale_activator_hold_results_total", map[string]string{"namespace": appNS, "name": name, "result": result})
		}
		sum += of("forwarded") - of("pod_unreachable")
	}
	return sum, nil
}

// waitAnswers waits for the target's first ready pod and for its public
// Service to answer, after checking that the Service's address is routed
// to one of the local cluster's links (nothing leaves the machine).
func waitAnswers(ctx context.Context, s *stack.Stack, t *target) error {
	hc := &http.Client{Timeout: 5 * time.Second}
	var last error
	return poll(ctx, 2*time.Minute, 500*time.Millisecond, func() (bool, error) {
		d, err := s.Deployment(ctx, appNS, t.name)
		if err != nil {
			last = fmt.Errorf("deployment: %w", err)
			return false, nil
		}
		if d.Status.ReadyReplicas < 1 {
			last = errors.New("no ready pod")
			return false, nil
		}
		if t.url == "" {
			u, err := s.PublicURL(ctx, appNS, t.name)
			if err != nil {
				last = err
				return false, nil
			}
			pu, err := url.Parse(u)
			if err != nil {
				return false, fmt.Errorf("public URL %q: %w", u, err)
			}
			ap, err := netip.ParseAddrPort(pu.Host)
			if err != nil {
				return false, fmt.Errorf("public URL %q: %w", u, err)
			}
			if err := localroute.Check(ap.Addr(), localroute.DevPrefix(cluster.Prefix+"-")); err != nil {
				return false, fmt.Errorf("public Service of %s: %w", t.name, err)
			}
			t.url = u
		}
		resp, err := hc.Get(t.url)
		if err != nil {
			last = err
			return false, nil
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			last = fmt.Errorf("GET %s: %s", t.url, resp.Status)
			return false, nil
		}
		return true, nil
	}, func() error { return fmt.Errorf("%s does not answer: %w", t.name, last) })
}

// waitSettled waits until the target's pods stand still at no more than
// one above want: wanted = ready, unchanged for 6 s. It returns the count.
func waitSettled(ctx context.Context, s *stack.Stack, name string, want int32, timeout time.Duration) (int32, error) {
	var (
		last  int32 = -1
		since time.Time
		state string
	)
	err := poll(ctx, timeout, 500*time.Millisecond, func() (bool, error) {
		d, err := s.Deployment(ctx, appNS, name)
		if err != nil {
			return false, fmt.Errorf("deployment %s: %w", name, err)
		}
		n := ptr.Deref(d.Spec.Replicas, 0)
		state = fmt.Sprintf("%d wanted, %d ready", n, d.Status.ReadyReplicas)
		if n != d.Status.ReadyReplicas || n > want+1 || n != last {
			last, since = n, time.Now()
			if n != d.Status.ReadyReplicas {
				last = -1
			}
			return false, nil
		}
		return time.Since(since) >= 6*time.Second, nil
	}, func() error { return fmt.Errorf("%s after %s (want %d)", state, timeout, want) })
	return last, err
}

// waitZero waits until the target has no pod left and its ServerlessService
// is in Proxy mode, the activators holding its next requests.
func waitZero(ctx context.Context, s *stack.Stack, tl *timeline, name string, timeout time.Duration) error {
	var state string
	return poll(ctx, timeout, time.Second, func() (bool, error) {
		d, err := s.Deployment(ctx, appNS, name)
		if err != nil {
			return false, fmt.Errorf("deployment %s: %w", name, err)
		}
		proxy, known := tl.mode(name)
		state = fmt.Sprintf("%d wanted, %d pods, Proxy %v (known %v)", ptr.Deref(d.Spec.Replicas, 0), d.Status.Replicas, proxy, known)
		return ptr.Deref(d.Spec.Replicas, 0) == 0 && d.Status.Replicas == 0 && proxy, nil
	}, func() error { return fmt.Errorf("%s is not at zero after %s: %s", name, timeout, state) })
}

// poll calls f every period until it says done, fails, ctx ends or the
// timeout passes (then the error of timedOut).
func poll(ctx context.Context, timeout, period time.Duration, f func() (bool, error), timedOut func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		done, err := f()
		if err != nil || done {
			return err
		}
		if time.Now().After(deadline) {
			return timedOut()
		}
		if err := sleep(ctx, period); err != nil {
			return err
		}
	}
}

// sleep waits for d unless ctx ends first.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("interrupted: %w", ctx.Err())
	case <-t.C:
		return nil
	}
}
