package stack

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// ColdStartSteps are when watches first saw each step of one cold start
// of an app (App): its Deployment scaled up by the autoscaler (through
// /scale), its new pod created, scheduled, its sandbox ready (the
// kubelet's PodReadyToStartContainers), its IP in its status, its
// container running, its address in the private Service's EndpointSlices
// (ready or not: where the activator learns of the pod, to probe it), the
// pod Ready. A zero
// time is a step not seen. Each is when the event reached this process,
// so a step is seen when the component that made it wrote it to the API
// server (a kubelet writes a pod's status after the fact), plus the
// watch's delivery.
type ColdStartSteps struct {
	Scaled, Created, Scheduled, Sandbox, PodIP, Running, Endpoint, Ready time.Time
	// Pod is the new pod's name: the first pod of the app, not being
	// deleted, that the watch saw.
	Pod string
}

// ColdStartTrace follows one cold start of an app with three watches:
// its Deployment's, its pods' and its private Service's EndpointSlices'.
// Start it while the app is at zero with no pod left (a pod still
// terminating is ignored, an address in the EndpointSlices is not),
// before the request that wakes it.
type ColdStartTrace struct {
	mu     sync.Mutex
	steps  ColdStartSteps
	cancel context.CancelFunc
	done   sync.WaitGroup
}

// WatchColdStart starts the watches of app name (pods labelled app=name)
// in namespace ns; Stop ends them.
func WatchColdStart(ctx context.Context, cs kubernetes.Interface, ns, name string) (*ColdStartTrace, error) {
	ctx, cancel := context.WithCancel(ctx)
	tr := &ColdStartTrace{cancel: cancel}
	dw, err := cs.AppsV1().Deployments(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watch deployment %s/%s: %w", ns, name, err)
	}
	pw, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
	if err != nil {
		dw.Stop()
		cancel()
		return nil, fmt.Errorf("watch pods of %s/%s: %w", ns, name, err)
	}
	ew, err := cs.DiscoveryV1().EndpointSlices(ns).Watch(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name + privateSuffix})
	if err != nil {
		dw.Stop()
		pw.Stop()
		cancel()
		return nil, fmt.Errorf("watch EndpointSlices of %s/%s%s: %w", ns, name, privateSuffix, err)
	}
	seen := func(at *time.Time, now time.Time) {
		if at.IsZero() {
			*at = now
		}
	}
	tr.done.Go(func() {
		follow(ctx, dw, func(ev watch.Event, now time.Time) {
			if d, ok := ev.Object.(*appsv1.Deployment); ok && d.Spec.Replicas != nil && *d.Spec.Replicas > 0 {
				tr.mu.Lock()
				seen(&tr.steps.Scaled, now)
				tr.mu.Unlock()
			}
		})
	})
	tr.done.Go(func() {
		follow(ctx, pw, func(ev watch.Event, now time.Time) {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted || p.DeletionTimestamp != nil {
				return
			}
			tr.mu.Lock()
			defer tr.mu.Unlock()
			if tr.steps.Pod == "" {
				tr.steps.Pod = p.Name
			}
			if p.Name == tr.steps.Pod {
				seen(&tr.steps.Created, now)
				if p.Spec.NodeName != "" {
					seen(&tr.steps.Scheduled, now)
				}
				for _, c := range p.Status.Conditions {
					if c.Status != corev1.ConditionTrue {
						continue
					}
					switch c.Type {
					case corev1.PodReadyToStartContainers:
						seen(&tr.steps.Sandbox, now)
					case corev1.PodReady:
						seen(&tr.steps.Ready, now)
					}
				}
				if p.Status.PodIP != "" {
					seen(&tr.steps.PodIP, now)
				}
				if len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Running != nil {
					seen(&tr.steps.Running, now)
				}
			}
		})
	})
	tr.done.Go(func() {
		follow(ctx, ew, func(ev watch.Event, now time.Time) {
			es, ok := ev.Object.(*discoveryv1.EndpointSlice)
			if !ok || ev.Type == watch.Deleted {
				return
			}
			for _, ep := range es.Endpoints {
				if len(ep.Addresses) > 0 && (ep.Conditions.Terminating == nil || !*ep.Conditions.Terminating) {
					tr.mu.Lock()
					seen(&tr.steps.Endpoint, now)
					tr.mu.Unlock()
					return
				}
			}
		})
	})
	return tr, nil
}

// privateSuffix names an app's private Service (the controller's
// names.PrivateServiceName): its EndpointSlices hold the app's pods, ready
// or not.
const privateSuffix = "-private"

// follow hands w's events to f, each with the time it arrived, until ctx
// ends or the watch does; then it stops w.
func follow(ctx context.Context, w watch.Interface, f func(watch.Event, time.Time)) {
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			f(ev, time.Now())
		}
	}
}

// Stop ends the watches and waits for them.
func (tr *ColdStartTrace) Stop() {
	tr.cancel()
	tr.done.Wait()
}

// Steps are the steps seen so far.
func (tr *ColdStartTrace) Steps() ColdStartSteps {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.steps
}

// Breakdown is the cold start's steps as offsets from start (the
// requests sent), in the order they happened, first being the first
// answer: the activator forwards as soon as its own probe of the pod
// succeeds, which may be before the kubelet's readiness probe marks the
// pod Ready.
func (tr *ColdStartTrace) Breakdown(start, first time.Time) string {
	st := tr.Steps()
	steps := []struct {
		what string
		at   time.Time
	}{{"scaled (/scale)", st.Scaled}, {"pod created", st.Created}, {"scheduled", st.Scheduled},
		{"sandbox ready", st.Sandbox}, {"pod IP", st.PodIP}, {"container running", st.Running}, {"endpoint published", st.Endpoint},
		{"Ready (kubelet)", st.Ready}, {"first answer", first}}
	sort.SliceStable(steps, func(i, j int) bool {
		return !steps[i].at.IsZero() && (steps[j].at.IsZero() || steps[i].at.Before(steps[j].at))
	})
	var b strings.Builder
	fmt.Fprintf(&b, "first answer %s after the requests (pod %s); each step's time since the requests, as the watches saw it:", first.Sub(start).Round(time.Millisecond), st.Pod)
	for _, s := range steps {
		if s.at.IsZero() {
			fmt.Fprintf(&b, " %s not seen;", s.what)
			continue
		}
		fmt.Fprintf(&b, " %s %s;", s.what, s.at.Sub(start).Round(time.Millisecond))
	}
	return b.String()
}
