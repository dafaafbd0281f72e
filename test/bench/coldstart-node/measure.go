package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/localroute"
	"github.com/sockscale/sockscale/test/cluster"
	"github.com/sockscale/sockscale/test/stack"
)

const (
	appNS = "coldstart"
	// listeningForHeader is the test app's header: microseconds from its
	// listener opening to the request's arrival (test/autoscale).
	listeningForHeader = "X-Listening-For"
)

// target is one app pinned to one node.
type target struct {
	name, node, kind string // kind: "simulated" or "real"
	pod              func(*corev1.PodSpec)
	url              string
}

// sample is one cold start as the client and the watches saw it.
type sample struct {
	start, end time.Time // the request sent, its answer read
	code       int
	err        error
	// listeningFor is the answer's X-Listening-For; -1 if absent.
	listeningFor time.Duration
	steps        stack.ColdStartSteps
	// answeredBy is the pod the answer names.
	answeredBy string
}

func (s sample) ok() bool { return s.err == nil && s.code == http.StatusOK }

// result is one target's samples.
type result struct {
	t       *target
	samples []sample
}

func (r *result) failed() int {
	n := 0
	for _, s := range r.samples {
		if !s.ok() {
			n++
		}
	}
	return n
}

// appArgs: no shutdown delay, so a pod that is told to go goes at once
// and the next sample need not wait for it.
var appArgs = []string{"--port=8080", "--shutdown-delay=0s"}

func targets() []*target {
	sim, real := cluster.NodeName(0), cluster.RealNodeName(0)
	return []*target{
		{name: "cold-sim", node: sim, kind: "simulated", pod: func(p *corev1.PodSpec) {
			p.NodeSelector = map[string]string{"kubernetes.io/hostname": sim}
			p.Containers[0].Args = appArgs
		}},
		{name: "cold-real", node: real, kind: "real", pod: func(p *corev1.PodSpec) {
			stack.OnRealNode(real)(p)
			p.Containers[0].Args = appArgs
		}},
	}
}

// measure deploys the targets and takes f.samples cold starts of each.
// The targets cycle concurrently, each waiting for its own scale to zero
// while the other measures, but one cold start is measured at a time: on
// a small machine two at once would share its CPU and each other's
// numbers.
func measure(ctx context.Context, c *cluster.Cluster, s *stack.Stack, f *flags, say func(string, ...any)) ([]*result, error) {
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		return nil, fmt.Errorf("clientset: %w", err)
	}
	ts := targets()
	var results []*result
	for _, t := range ts {
		say("%s: deploying on %s (min-scale 0, %v)", t.name, t.node, appArgs)
		if err := s.Deploy(ctx, stack.App{Namespace: appNS, Name: t.name, Pod: t.pod,
			Spec: func(p *v1alpha1.PodAutoscalerSpec) { p.MinScale = ptr.To(int32(0)) }}); err != nil {
			return nil, fmt.Errorf("deploy %s: %w", t.name, err)
		}
		results = append(results, &result{t: t})
	}
	for _, t := range ts {
		if err := waitAnswers(ctx, s, t); err != nil {
			return results, err
		}
		if err := checkNode(ctx, s, t); err != nil {
			return results, err
		}
		say("%s: answers at %s", t.name, t.url)
	}
	var (
		one  sync.Mutex // one cold start measured at a time
		wg   sync.WaitGroup
		errs = make([]error, len(results))
	)
	for i, r := range results {
		wg.Go(func() {
			for n := range f.samples {
				if err := waitZero(ctx, s, r.t, 3*time.Minute); err != nil {
					errs[i] = fmt.Errorf("%s, sample %d: %w", r.t.name, n+1, err)
					return
				}
				one.Lock()
				smp, err := coldStart(ctx, cs, r.t, f.timeout)
				one.Unlock()
				if err != nil {
					errs[i] = fmt.Errorf("%s, sample %d: %w", r.t.name, n+1, err)
					return
				}
				r.samples = append(r.samples, smp)
				say("%s %d/%d: %s", r.t.name, n+1, f.samples, smp.summary())
			}
		})
	}
	wg.Wait()
	return results, errors.Join(errs...)
}

// coldStart sends one request to t at zero on a new connection and
// follows the cold start until its pod is Ready (or 30 s more). An error
// is the watches' or ctx's: a request that fails is a failed sample.
func coldStart(ctx context.Context, cs kubernetes.Interface, t *target, timeout time.Duration) (sample, error) {
	tr, err := stack.WatchColdStart(ctx, cs, appNS, t.name)
	if err != nil {
		return sample{}, err
	}
	defer tr.Stop()
	hc := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	defer hc.CloseIdleConnections()
	smp := sample{listeningFor: -1}
	smp.start = time.Now()
	smp.code, smp.answeredBy, smp.listeningFor, smp.err = get(ctx, hc, t.url)
	smp.end = time.Now()
	if ctx.Err() != nil {
		return smp, ctx.Err()
	}
	// Ready comes when the kubelet's readiness probe (every second) has
	// passed and its status is written: usually after the first answer.
	deadline := time.Now().Add(30 * time.Second)
	for tr.Steps().Ready.IsZero() && time.Now().Before(deadline) {
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return smp, err
		}
	}
	tr.Stop()
	smp.steps = tr.Steps()
	return smp, nil
}

// get sends one GET and reads the answer: its status, the pod it names
// ("pod <name>: ..."), its X-Listening-For (-1 if absent).
func get(ctx context.Context, hc *http.Client, u string) (code int, pod string, listeningFor time.Duration, err error) {
	listeningFor = -1
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, "", listeningFor, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", listeningFor, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return resp.StatusCode, "", listeningFor, fmt.Errorf("read the answer: %w", err)
	}
	if v := resp.Header.Get(listeningForHeader); v != "" {
		us, perr := strconv.ParseInt(v, 10, 64)
		if perr != nil || us < 0 {
			return resp.StatusCode, "", listeningFor, fmt.Errorf("%s %q: not whole microseconds", listeningForHeader, v)
		}
		listeningFor = time.Duration(us) * time.Microsecond
	}
	if name, _, ok := strings.Cut(strings.TrimPrefix(string(body), "pod "), ":"); ok && strings.HasPrefix(string(body), "pod ") {
		pod = name
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, pod, listeningFor, fmt.Errorf("GET %s: %s: %.200s", u, resp.Status, body)
	}
	return resp.StatusCode, pod, listeningFor, nil
}

// summary is the sample in one line, for the progress output.
func (s sample) summary() string {
	if !s.ok() {
		return fmt.Sprintf("FAILED after %s: %v", s.end.Sub(s.start).Round(time.Millisecond), s.err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "200 in %s", s.end.Sub(s.start).Round(time.Millisecond))
	if s.listeningFor >= 0 {
		fmt.Fprintf(&b, ", activator share %s", s.listeningFor.Round(100*time.Microsecond))
	}
	if s.answeredBy != s.steps.Pod {
		fmt.Fprintf(&b, ", answered by pod %q but the watches followed %q", s.answeredBy, s.steps.Pod)
	}
	for _, st := range stepOffsets(s) {
		if st.seen {
			fmt.Fprintf(&b, "; %s %s", st.what, st.at.Round(time.Millisecond))
		} else {
			fmt.Fprintf(&b, "; %s not seen", st.what)
		}
	}
	return b.String()
}

// waitAnswers waits for the target's first pod to answer through its
// public Service, after checking that the Service's address is routed to
// one of the local cluster's links (nothing leaves the machine).
func waitAnswers(ctx context.Context, s *stack.Stack, t *target) error {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var last error
	return poll(ctx, 3*time.Minute, 500*time.Millisecond, func() (bool, error) {
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
		if _, _, _, err := get(ctx, hc, t.url); err != nil {
			last = err
			return false, nil
		}
		return true, nil
	}, func() error { return fmt.Errorf("%s does not answer: %w", t.name, last) })
}

// checkNode fails unless the target's pods run on its node.
func checkNode(ctx context.Context, s *stack.Stack, t *target) error {
	var pods corev1.PodList
	if err := s.Client.List(ctx, &pods, client.InNamespace(appNS), client.MatchingLabels{"app": t.name}); err != nil {
		return err
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName != t.node {
			return fmt.Errorf("%s: pod %s runs on %q, want %s", t.name, p.Name, p.Spec.NodeName, t.node)
		}
	}
	return nil
}

// waitZero waits until the target is at zero: no pod wanted, none left
// (not even terminating), no address in its private Service's
// EndpointSlices, and its PodAutoscaler and ServerlessService in Proxy
// mode, the activators holding its next request.
func waitZero(ctx context.Context, s *stack.Stack, t *target, timeout time.Duration) error {
	var state string
	return poll(ctx, timeout, 250*time.Millisecond, func() (bool, error) {
		d, err := s.Deployment(ctx, appNS, t.name)
		if err != nil {
			return false, fmt.Errorf("deployment %s: %w", t.name, err)
		}
		var pods corev1.PodList
		if err := s.Client.List(ctx, &pods, client.InNamespace(appNS), client.MatchingLabels{"app": t.name}); err != nil {
			return false, fmt.Errorf("pods of %s: %w", t.name, err)
		}
		pa, err := s.PA(ctx, appNS, t.name)
		if err != nil {
			return false, fmt.Errorf("PodAutoscaler %s: %w", t.name, err)
		}
		var sks v1alpha1.ServerlessService
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: t.name}, &sks); err != nil {
			return false, fmt.Errorf("ServerlessService %s: %w", t.name, err)
		}
		var slices discoveryv1.EndpointSliceList
		if err := s.Client.List(ctx, &slices, client.InNamespace(appNS), client.MatchingLabels{discoveryv1.LabelServiceName: t.name + "-private"}); err != nil {
			return false, fmt.Errorf("EndpointSlices of %s-private: %w", t.name, err)
		}
		endpoints := 0
		for _, es := range slices.Items {
			endpoints += len(es.Endpoints)
		}
		want := ptr.Deref(d.Spec.Replicas, -1)
		state = fmt.Sprintf("%d pods wanted, %d in the Deployment's status, %d pod objects, %d private endpoints, PodAutoscaler %q, ServerlessService %q",
			want, d.Status.Replicas, len(pods.Items), endpoints, pa.Status.Mode, sks.Status.Mode)
		return want == 0 && d.Status.Replicas == 0 && len(pods.Items) == 0 && endpoints == 0 &&
			pa.Status.Mode == v1alpha1.ModeProxy && sks.Status.Mode == v1alpha1.ModeProxy, nil
	}, func() error { return fmt.Errorf("not at zero after %s: %s", timeout, state) })
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
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("interrupted: %w", ctx.Err())
	case <-t.C:
		return nil
	}
}
