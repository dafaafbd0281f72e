package stack

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

// The trace notes each step once, when its watch first shows it, for the
// first pod that is not being deleted; a pod still terminating from the
// last scale to zero is not the new one.
func TestColdStartTrace(t *testing.T) {
	ctx := context.Background()
	meta := func(name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{"app": "app"}}
	}
	d := &appsv1.Deployment{ObjectMeta: meta("app"), Spec: appsv1.DeploymentSpec{Replicas: ptr.To(int32(0))}}
	cs := fake.NewClientset(d)
	tr, err := WatchColdStart(ctx, cs, "ns", "app")
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Stop()
	// waitSeen waits until the trace has seen what the last write showed.
	waitSeen := func(what string, cond func(ColdStartSteps) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond(tr.Steps()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s not seen: %+v", what, tr.Steps())
			}
			time.Sleep(time.Millisecond)
		}
	}
	// Pause between writes so each step's time is after the last one's.
	step := func() { time.Sleep(2 * time.Millisecond) }

	old := &corev1.Pod{ObjectMeta: meta("old"), Spec: corev1.PodSpec{NodeName: "node-a"}}
	old.DeletionTimestamp = ptr.To(metav1.Now())
	old.Finalizers = []string{"test"}
	if _, err := cs.CoreV1().Pods("ns").Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	step()
	d.Spec.Replicas = ptr.To(int32(1))
	if _, err := cs.AppsV1().Deployments("ns").Update(ctx, d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSeen("scaled", func(s ColdStartSteps) bool { return !s.Scaled.IsZero() })
	step()
	p := &corev1.Pod{ObjectMeta: meta("new")}
	if _, err := cs.CoreV1().Pods("ns").Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSeen("created", func(s ColdStartSteps) bool { return !s.Created.IsZero() })
	update := func(what string, f func(*corev1.Pod), seen func(ColdStartSteps) bool) {
		t.Helper()
		step()
		f(p)
		var err error
		if p, err = cs.CoreV1().Pods("ns").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitSeen(what, seen)
	}
	cond := func(c corev1.PodConditionType) corev1.PodCondition {
		return corev1.PodCondition{Type: c, Status: corev1.ConditionTrue}
	}
	update("scheduled", func(p *corev1.Pod) { p.Spec.NodeName = "real-a" },
		func(s ColdStartSteps) bool { return !s.Scheduled.IsZero() })
	update("sandbox", func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, cond(corev1.PodReadyToStartContainers))
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{}}}}
	}, func(s ColdStartSteps) bool { return !s.Sandbox.IsZero() })
	update("pod IP", func(p *corev1.Pod) { p.Status.PodIP = "10.244.100.8" }, func(s ColdStartSteps) bool { return !s.PodIP.IsZero() })
	update("running", func(p *corev1.Pod) {
		p.Status.ContainerStatuses[0].State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	}, func(s ColdStartSteps) bool { return !s.Running.IsZero() })
	// The private Service's slice: the old pod's address, terminating, is
	// not the new pod's; then the new one's, not ready yet.
	step()
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "app-private-x", Labels: map[string]string{discoveryv1.LabelServiceName: "app-private"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.100.7"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false), Terminating: ptr.To(true)}}},
	}
	if _, err := cs.DiscoveryV1().EndpointSlices("ns").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if st := tr.Steps(); !st.Endpoint.IsZero() {
		t.Fatalf("a terminating address taken for the new pod's: %+v", st)
	}
	slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.244.100.8"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}})
	if _, err := cs.DiscoveryV1().EndpointSlices("ns").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSeen("endpoint", func(s ColdStartSteps) bool { return !s.Endpoint.IsZero() })
	update("ready", func(p *corev1.Pod) { p.Status.Conditions = append(p.Status.Conditions, cond(corev1.PodReady)) },
		func(s ColdStartSteps) bool { return !s.Ready.IsZero() })
	// A later write does not move a step already seen.
	before := tr.Steps()
	update("the last write", func(p *corev1.Pod) { p.Labels["other"] = "x" }, func(ColdStartSteps) bool { return true })
	step()
	tr.Stop()

	got := tr.Steps()
	if got != before {
		t.Errorf("steps moved after a later write: %+v, then %+v", before, got)
	}
	if got.Pod != "new" {
		t.Errorf("pod %q, want the new one, not the one terminating", got.Pod)
	}
	order := []time.Time{got.Scaled, got.Created, got.Scheduled, got.Sandbox, got.PodIP, got.Running, got.Endpoint, got.Ready}
	for i := 1; i < len(order); i++ {
		if !order[i].After(order[i-1]) {
			t.Errorf("step %d seen at %s, not after step %d at %s: %+v", i, order[i], i-1, order[i-1], got)
		}
	}
	start := got.Scaled.Add(-time.Second)
	b := tr.Breakdown(start, got.Ready.Add(time.Second))
	for _, want := range []string{"(pod new)", "scaled (/scale) 1s;", "pod created 1.", "first answer"} {
		if !strings.Contains(b, want) {
			t.Errorf("breakdown %q does not contain %q", b, want)
		}
	}
	if i, j := strings.Index(b, "Ready (kubelet)"), strings.LastIndex(b, "first answer"); i < 0 || j < i {
		t.Errorf("breakdown %q: want the steps in the order they happened, Ready before the first answer", b)
	}
}

// A step never seen is said so, after those seen.
func TestColdStartBreakdownNotSeen(t *testing.T) {
	start := time.Unix(100, 0)
	tr := &ColdStartTrace{steps: ColdStartSteps{Pod: "p", Scaled: start.Add(200 * time.Millisecond)}}
	got := tr.Breakdown(start, start.Add(time.Second))
	want := "first answer 1s after the requests (pod p); each step's time since the requests, as the watches saw it: scaled (/scale) 200ms; first answer 1s; pod created not seen;"
	if !strings.HasPrefix(got, want) || !strings.HasSuffix(got, "Ready (kubelet) not seen;") {
		t.Errorf("breakdown %q, want it to start %q and end with Ready not seen", got, want)
	}
}
