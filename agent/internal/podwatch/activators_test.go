package podwatch

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/events"
)

// limitedSet holds at most max addresses, as the kernel's map does, and
// keeps its previous set when refusing.
type limitedSet struct {
	mu  sync.Mutex
	max int
	ips []netip.Addr
}

func (s *limitedSet) SetActivators(ips []netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(ips) > s.max {
		return errors.New("too many")
	}
	s.ips = ips
	return nil
}

func (s *limitedSet) get() []netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ips
}

func activatorPod(ns, name, ip string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app.kubernetes.io/component": "activator"}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip},
	}
}

// TestActivatorsOnlyFromTheirNamespace: a tenant's pod with an activator's
// name and labels is not an activator; a set the kernel refuses shows in
// the metrics; no namespace is refused.
func TestActivatorsOnlyFromTheirNamespace(t *testing.T) {
	client := fake.NewClientset(
		activatorPod("sockscale-system", "sockscale-activator-a", "10.0.0.1"),
		activatorPod("sockscale-system", "sockscale-activator-b", "10.0.0.2"),
		activatorPod("team", "sockscale-activator-a", "10.0.9.9"), // a tenant's copy
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	set := &limitedSet{max: 2}
	reg := prometheus.NewRegistry()
	recorder := events.NewFakeRecorder(10)
	refusals := &RefusalEvents{Recorder: recorder, Limit: 2, Regarding: func() runtime.Object {
		return &corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: "sockscale-system", Name: "sockscale-agent-x"}
	}}
	done := make(chan error, 1)
	go func() {
		done <- WatchActivators(ctx, client, "sockscale-system", "app.kubernetes.io/component=activator", set, reg, refusals, quiet())
	}()
	want := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")}
	waitFor(t, func() bool { return slices.Equal(set.get(), want) }) // the release namespace's activators only

	// A third activator: more than the kernel holds. The set stays, loudly.
	if _, err := client.CoreV1().Pods("sockscale-system").Create(ctx, activatorPod("sockscale-system", "sockscale-activator-c", "10.0.0.3"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return gather(t, reg, "sockscale_agent_activator_set_failures_total") >= 1 }) // the refused set is counted
	if got := gather(t, reg, "sockscale_agent_activators"); got != 3 {
		t.Errorf("sockscale_agent_activators = %v, want 3", got)
	}
	if got := gather(t, reg, "sockscale_agent_activators_in_kernel"); got != 2 {
		t.Errorf("sockscale_agent_activators_in_kernel = %v, want 2 (the previous set)", got)
	}
	// And an Event on the agent's pod, once: a change of a pod that
	// leaves the set as it was (refused again) records none.
	select {
	case e := <-recorder.Events:
		if want := "Warning ActivatorSetRefused the kernel refused the set of 3 activator addresses (it holds at most 2)"; !strings.HasPrefix(e, want) {
			t.Errorf("event %q, want it to start %q", e, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no Event for the refused set")
	}
	c := activatorPod("sockscale-system", "sockscale-activator-c", "10.0.0.3")
	c.Annotations = map[string]string{"touched": "yes"}
	if _, err := client.CoreV1().Pods("sockscale-system").Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return gather(t, reg, "sockscale_agent_activator_set_failures_total") >= 2 }) // refused again
	select {
	case e := <-recorder.Events:
		t.Errorf("a second Event for the same refusal: %q", e)
	default:
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("watch: %v", err)
	}

	if err := WatchActivators(context.Background(), client, "", "app.kubernetes.io/component=activator", set, nil, nil, quiet()); err == nil {
		t.Error("an empty namespace was accepted: every namespace's pods would be activators")
	}
}

func gather(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// One Event per distinct refusal: the same refusal again records none, a
// refusal of another size does, and so does the same one after the
// kernel took a set in between. The regarded object is read once.
func TestRefusalEvents(t *testing.T) {
	type step struct {
		refused int // 0: the kernel took a set
	}
	recorder := events.NewFakeRecorder(10)
	reads := 0
	r := &RefusalEvents{Recorder: recorder, Limit: 1024, Regarding: func() runtime.Object {
		reads++
		return &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "agent"}
	}}
	var got []string
	for _, s := range []step{{1025}, {1025}, {1025}, {1030}, {0}, {1030}, {0}, {0}} {
		if s.refused == 0 {
			r.accepted()
		} else {
			r.refused(s.refused, errors.New("too many"))
		}
		select {
		case e := <-recorder.Events:
			got = append(got, e)
		default:
		}
	}
	msg := func(n int) string {
		return fmt.Sprintf("Warning ActivatorSetRefused the kernel refused the set of %d activator addresses (it holds at most 1024) and keeps its previous set: requests from the activators missing from it count as load (too many)", n)
	}
	if diff := cmp.Diff([]string{msg(1025), msg(1030), msg(1030)}, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if reads != 1 {
		t.Errorf("Regarding called %d times, want once", reads)
	}
	var none *RefusalEvents
	none.refused(2000, nil) // nil: no Events, no panic
	none.accepted()
}
