package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

// burstResult is the client's view of the requests sent at zero.
type burstResult struct {
	sent      time.Time
	latencies []time.Duration // of the requests answered 200, sorted
	failed    []string        // what went wrong with the others
	failedAt  []time.Duration // when they ended, sorted
	pods      map[string]int  // answers by the pod that gave them
}

// burst sends n requests to url at once, each on its own new connection,
// and waits for every answer.
func burst(ctx context.Context, url string, n int) *burstResult {
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}
	res := &burstResult{pods: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	res.sent = time.Now()
	for range n {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				mu.Lock()
				res.failed = append(res.failed, err.Error())
				mu.Unlock()
				return
			}
			resp, err := hc.Do(req)
			var body []byte
			if err == nil {
				body, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			took := time.Since(res.sent)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				res.failed, res.failedAt = append(res.failed, err.Error()), append(res.failedAt, took)
			case resp.StatusCode != http.StatusOK:
				res.failed = append(res.failed, fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(body))))
				res.failedAt = append(res.failedAt, took)
			default:
				res.latencies = append(res.latencies, took)
				// The app answers "pod <name>: did nothing ...".
				pod, _, _ := strings.Cut(strings.TrimPrefix(string(body), "pod "), ":")
				res.pods[pod]++
			}
		})
	}
	wg.Wait()
	slices.Sort(res.latencies)
	slices.Sort(res.failedAt)
	return res
}

// stage is one step of a scale from zero as the demo saw it: when (the
// demo's clock: a watch event's or a scrape's arrival, or the client's own
// time) and, where the object records it, the API server's timestamp
// (whole seconds).
type stage struct {
	// key names the stage for marks (the first of a key is kept); name
	// is what the table shows.
	key     string
	name    string
	at      time.Time
	api     time.Time
	apiWhat string
	source  string
}

// marks keeps the first time each stage was seen.
type marks struct {
	mu     sync.Mutex
	stages map[string]stage
}

func (m *marks) mark(st stage) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stages == nil {
		m.stages = map[string]stage{}
	}
	if st.key == "" {
		st.key = st.name
	}
	if _, ok := m.stages[st.key]; !ok {
		m.stages[st.key] = st
	}
}

// Stage names, in the order a scale from zero goes through them.
const (
	stSent       = "requests sent at zero"
	stHeld       = "held by an activator (it pokes the controller)"
	stScale      = "/scale written: Deployment spec.replicas 0 -> %d"
	stDesired    = "PodAutoscaler status: desiredScale %d"
	stCreated    = "pod created (ReplicaSet controller)"
	stScheduled  = "pod scheduled"
	stStarted    = "container started (kubelet status)"
	stListed     = "pod in the private EndpointSlice (probing starts)"
	stSliceReady = "private EndpointSlice: pod ready"
	stProbed     = "an activator's probe finds the pod ready"
	stForwarded  = "first held request forwarded to the pod"
	stAnswered   = "first response at the client"
	stLast       = "last response at the client"
	stFailed     = "first failed response at the client"
	stKubeReady  = "pod Ready (kubelet readiness probe)"
	stServe      = "PodAutoscaler mode Serve (activator leaves the path)"
	srcClient    = "client"
	srcScrape    = "activator /metrics, 10 ms"
	srcWatch     = "watch event"
)

// watchScaleUp watches the app's PodAutoscaler, Deployment, pods and
// private EndpointSlices until ctx ends and marks each stage of a scale
// from zero the first time it is seen after since() is set (before that,
// it only learns which pods are old). ready is closed once the watches run.
func watchScaleUp(ctx context.Context, wc client.WithWatch, ns, name string, since func() time.Time, m *marks, ready chan<- struct{}) error {
	lists := []struct {
		list client.ObjectList
		sel  client.MatchingLabels
	}{
		{&v1alpha1.PodAutoscalerList{}, nil},
		{&appsv1.DeploymentList{}, nil},
		{&corev1.PodList{}, client.MatchingLabels{"app": name}},
		{&discoveryv1.EndpointSliceList{}, client.MatchingLabels{discoveryv1.LabelServiceName: name + "-private"}},
	}
	ws := make([]watch.Interface, 0, len(lists))
	for _, l := range lists {
		w, err := wc.Watch(ctx, l.list, client.InNamespace(ns), l.sel)
		if err != nil {
			for _, w := range ws {
				w.Stop()
			}
			return fmt.Errorf("watch %T: %w", l.list, err)
		}
		ws = append(ws, w)
	}
	close(ready)
	var mu sync.Mutex
	old := map[types.UID]bool{} // pods that were there before the requests
	isOld := func(uid types.UID, before bool) bool {
		mu.Lock()
		defer mu.Unlock()
		if before {
			old[uid] = true
		}
		return old[uid]
	}
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() {
			defer w.Stop()
			for {
				var ev watch.Event
				select {
				case <-ctx.Done():
					return
				case e, ok := <-w.ResultChan():
					if !ok {
						return
					}
					ev = e
				}
				now := time.Now()
				t0 := since()
				switch o := ev.Object.(type) {
				case *v1alpha1.PodAutoscaler:
					if t0.IsZero() || o.Name != name {
						continue
					}
					if d := o.Status.DesiredScale; d != nil && *d > 0 {
						m.mark(stage{key: stDesired, name: fmt.Sprintf(stDesired, *d), at: now, source: srcWatch})
					}
					if o.Status.Mode == v1alpha1.ModeServe {
						m.mark(stage{name: stServe, at: now, source: srcWatch})
					}
				case *appsv1.Deployment:
					if t0.IsZero() || o.Name != name || o.Spec.Replicas == nil || *o.Spec.Replicas == 0 {
						continue
					}
					m.mark(stage{key: stScale, name: fmt.Sprintf(stScale, *o.Spec.Replicas), at: now, source: srcWatch, api: scaleWritten(o), apiWhat: "managedFields, /scale"})
				case *corev1.Pod:
					if isOld(o.UID, t0.IsZero() || ev.Type == watch.Deleted || o.DeletionTimestamp != nil) {
						continue
					}
					markPod(m, o, now)
				case *discoveryv1.EndpointSlice:
					for _, ep := range o.Endpoints {
						if ep.TargetRef == nil || isOld(ep.TargetRef.UID, t0.IsZero() || ev.Type == watch.Deleted) {
							continue
						}
						m.mark(stage{name: stListed, at: now, source: srcWatch})
						if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
							m.mark(stage{name: stSliceReady, at: now, source: srcWatch})
						}
					}
				}
			}
		})
	}
	wg.Wait()
	return nil
}

// markPod marks the stages a new pod has reached.
func markPod(m *marks, p *corev1.Pod, now time.Time) {
	m.mark(stage{name: stCreated, at: now, source: srcWatch, api: p.CreationTimestamp.Time, apiWhat: "creationTimestamp"})
	cond := func(t corev1.PodConditionType) *corev1.PodCondition {
		for i := range p.Status.Conditions {
			if c := &p.Status.Conditions[i]; c.Type == t && c.Status == corev1.ConditionTrue {
				return c
			}
		}
		return nil
	}
	if p.Spec.NodeName != "" {
		st := stage{name: stScheduled, at: now, source: srcWatch}
		if c := cond(corev1.PodScheduled); c != nil {
			st.api, st.apiWhat = c.LastTransitionTime.Time, "PodScheduled"
		}
		m.mark(st)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if r := cs.State.Running; r != nil {
			m.mark(stage{name: stStarted, at: now, source: srcWatch, api: r.StartedAt.Time, apiWhat: "startedAt"})
		}
	}
	if c := cond(corev1.PodReady); c != nil {
		m.mark(stage{name: stKubeReady, at: now, source: srcWatch, api: c.LastTransitionTime.Time, apiWhat: "Ready"})
	}
}

// scaleWritten is when the /scale subresource last wrote the Deployment
// (its managedFields entry), zero when unknown.
func scaleWritten(d *appsv1.Deployment) time.Time {
	var t time.Time
	for _, f := range d.ManagedFields {
		if f.Subresource == "scale" && f.Operation == metav1.ManagedFieldsOperationUpdate && f.Time != nil && f.Time.After(t) {
			t = f.Time.Time
		}
	}
	return t
}

// breakdown is the stages of one scale from zero in the order they were
// seen, with the client's and the activators' own numbers.
type breakdown struct {
	stages     []stage
	burst      *burstResult
	coldStarts []string
}

func newBreakdown(b *burstResult, m *marks, tl *actTimeline) *breakdown {
	bd := &breakdown{burst: b}
	bd.stages = append(bd.stages, stage{name: stSent, at: b.sent, source: srcClient})
	if n := len(b.latencies); n > 0 {
		bd.stages = append(bd.stages,
			stage{name: stAnswered, at: b.sent.Add(b.latencies[0]), source: srcClient},
			stage{name: stLast, at: b.sent.Add(b.latencies[n-1]), source: srcClient})
	}
	if len(b.failedAt) > 0 {
		bd.stages = append(bd.stages, stage{name: stFailed, at: b.sent.Add(b.failedAt[0]), source: srcClient})
	}
	if tl != nil {
		for _, s := range []stage{{name: stHeld, at: tl.held}, {name: stProbed, at: tl.podReady}, {name: stForwarded, at: tl.forwarded}} {
			if !s.at.IsZero() {
				s.source = srcScrape
				bd.stages = append(bd.stages, s)
			}
		}
		bd.coldStarts = tl.coldStarts()
	}
	m.mu.Lock()
	for _, s := range m.stages {
		bd.stages = append(bd.stages, s)
	}
	m.mu.Unlock()
	slices.SortStableFunc(bd.stages, func(a, b stage) int { return a.at.Compare(b.at) })
	return bd
}

// write prints the breakdown as a table: each stage's time after the
// requests were sent, the step from the stage before, where the time comes
// from and the API server's own timestamp where there is one.
func (bd *breakdown) write(w io.Writer) {
	b := bd.burst
	fmt.Fprintf(w, "\nThe first request at zero, stage by stage (%d requests sent at once at %s; %d answered 200", len(b.latencies)+len(b.failed), b.sent.Format("15:04:05.000"), len(b.latencies))
	if len(b.failed) > 0 {
		fmt.Fprintf(w, ", %d failed: %s", len(b.failed), b.failed[0])
	}
	fmt.Fprintln(w, "):")
	const row = "  %-54s %8s %8s  %-26s %s\n"
	fmt.Fprintf(w, row, "stage", "at", "step", "time source", "API timestamp (1 s)")
	prev := b.sent
	for _, s := range bd.stages {
		api := ""
		if !s.api.IsZero() {
			api = fmt.Sprintf("%s %s", s.api.Local().Format("15:04:05"), s.apiWhat)
		}
		fmt.Fprintf(w, row, s.name, ms(s.at.Sub(b.sent)), "+"+ms(s.at.Sub(prev)), s.source, api)
		prev = s.at
	}
	if n := len(b.latencies); n > 0 {
		fmt.Fprintf(w, "  whole first request %s (median %s, last %s), client's clock; answered by %s\n",
			ms(b.latencies[0]), ms(b.latencies[n/2]), ms(b.latencies[n-1]), podCounts(b.pods))
	}
	if len(bd.coldStarts) > 0 {
		fmt.Fprintf(w, "  the activators' own cold start (first request held -> first forwarded, sockscale_activator_cold_start_duration_seconds): %s\n", strings.Join(bd.coldStarts, ", "))
	}
	fmt.Fprintln(w, `  Time sources: every "at" is this machine's clock, which the local cluster's processes share:
  the client's own for requests and responses, a watch event's arrival for API objects (a few ms
  after the write), a scrape's answer for the activators' metrics (late by up to 10 ms). The API
  server's timestamps have whole seconds only.`)
}

func podCounts(pods map[string]int) string {
	var parts []string
	for p, n := range pods {
		parts = append(parts, fmt.Sprintf("%s (%d)", p, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%d ms", d.Round(time.Millisecond).Milliseconds())
}
