package socketlayer

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/sockscale/sockscale/internal/stats"
)

var t0 = time.Date(2026, 11, 24, 8, 0, 0, 0, time.UTC)

func batch(node string, st stats.RedirectState, reason string) *stats.Batch {
	return &stats.Batch{Node: node, Period: time.Second, NodeState: &stats.NodeState{SocketRedirect: st, Reason: reason}}
}

func TestTrackerSummary(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	tr := NewTracker(clk)
	if s := tr.Summary(); s.Warm || s.Reporting() {
		t.Fatalf("a new tracker: %+v, want cold and no node", s)
	}
	tr.Record(batch("node-b", stats.RedirectActive, ""))
	tr.Record(batch("node-c", stats.RedirectOff, "--socket-redirect=off"))
	tr.Record(batch("node-a", stats.RedirectSyncing, "starting"))
	tr.Record(&stats.Batch{Node: "activator-0", Period: time.Second}) // an activator: no state
	clk.Step(SilentAfter - time.Second)
	tr.Record(batch("node-a", stats.RedirectActive, "")) // synced since
	s := tr.Summary()
	if s.Warm || s.Active != 2 || len(s.Others) != 1 || s.Others[0] != (NodeState{"node-c", stats.RedirectOff, "--socket-redirect=off"}) {
		t.Errorf("after the first reports: %+v, want node-a and node-b active, node-c off, not warm yet", s)
	}
	// node-b and node-c fall silent; node-a keeps reporting.
	clk.Step(2 * time.Second)
	tr.Record(batch("node-a", stats.RedirectActive, ""))
	s = tr.Summary()
	if !s.Warm || s.Active != 1 || len(s.Others) != 2 {
		t.Fatalf("after %v of silence: %+v, want node-a active and two silent nodes", SilentAfter+time.Second, s)
	}
	for i, node := range []string{"node-b", "node-c"} {
		if o := s.Others[i]; o.Node != node || o.State != Silent || !strings.Contains(o.Reason, t0.Format(time.RFC3339)) {
			t.Errorf("others[%d] = %+v, want %s silent since %s (sorted by name)", i, o, node, t0.Format(time.RFC3339))
		}
	}
	// A silent node's reason names when it was last heard, not how long
	// ago: the summary, and so the conditions, hold still while it stays silent.
	key := s.key()
	clk.Step(time.Minute)
	tr.Record(batch("node-a", stats.RedirectActive, ""))
	if k := tr.Summary().key(); k != key {
		t.Errorf("the summary changed while nothing but time did:\n%q\n%q", key, k)
	}
	clk.Step(ForgetAfter)
	tr.Record(batch("node-a", stats.RedirectActive, ""))
	if s := tr.Summary(); s.Active != 1 || len(s.Others) != 0 {
		t.Errorf("after %v: %+v, want the silent nodes forgotten", ForgetAfter, s)
	}
}

func TestCondition(t *testing.T) {
	svc := &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
		Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
	headless := svc.DeepCopy()
	headless.Spec.ClusterIP, headless.Spec.ClusterIPs = corev1.ClusterIPNone, []string{corev1.ClusterIPNone}
	udp := svc.DeepCopy()
	udp.Spec.Ports[0].Protocol = corev1.ProtocolUDP
	ipv6 := svc.DeepCopy()
	ipv6.Spec.ClusterIP, ipv6.Spec.ClusterIPs = "fd5c:a1e:96::a", []string{"fd5c:a1e:96::a"}
	active := Summary{Warm: true, Active: 3}
	var many []NodeState
	for _, n := range []string{"n1", "n2", "n3", "n4", "n5"} {
		many = append(many, NodeState{Node: n, State: stats.RedirectUnavailable, Reason: "the kernel cannot load cgroup/connect4"})
	}
	tests := []struct {
		name     string
		s        Summary
		svc      *corev1.Service
		wantOK   bool
		status   metav1.ConditionStatus
		reason   string
		contains []string
		excludes []string
	}{
		{name: "every node active", s: active, svc: svc, wantOK: true, status: metav1.ConditionTrue, reason: ReasonInEffect},
		{name: "IPv6 only, every node active", s: active, svc: ipv6, wantOK: true, status: metav1.ConditionTrue, reason: ReasonInEffect},
		{name: "cold, nothing heard", s: Summary{}, svc: svc, wantOK: false},
		{name: "cold, but heard", s: Summary{Active: 1}, svc: svc, wantOK: true, status: metav1.ConditionTrue, reason: ReasonInEffect},
		{name: "warm, nothing heard", s: Summary{Warm: true}, svc: svc, wantOK: true, status: metav1.ConditionUnknown, reason: ReasonNoAgentReports},
		{name: "no public Service", s: active, svc: nil, wantOK: true, status: metav1.ConditionFalse, reason: ReasonNotRedirectable, contains: []string{"does not exist"}},
		{name: "headless", s: active, svc: headless, wantOK: true, status: metav1.ConditionFalse, reason: ReasonNotRedirectable, contains: []string{"headless"}},
		{name: "UDP only", s: active, svc: udp, wantOK: true, status: metav1.ConditionFalse, reason: ReasonNotRedirectable, contains: []string{"not TCP"}},
		{name: "one node off", svc: svc, wantOK: true, status: metav1.ConditionFalse, reason: ReasonNotOnEveryNode,
			s:        Summary{Warm: true, Active: 2, Others: []NodeState{{"node-c", stats.RedirectOff, "--socket-redirect=off"}}},
			contains: []string{"1 node: node-c (off: --socket-redirect=off)", "kube-proxy"}},
		{name: "off beats syncing", svc: svc, wantOK: true, status: metav1.ConditionFalse, reason: ReasonNotOnEveryNode,
			s:        Summary{Warm: true, Others: []NodeState{{"node-a", stats.RedirectSyncing, "starting"}, {"node-b", "unreadable", `socket-redirect="sideways"`}}},
			contains: []string{"1 node: node-b (unreadable: "}, excludes: []string{"node-a"}},
		{name: "syncing and silent", svc: svc, wantOK: true, status: metav1.ConditionUnknown, reason: ReasonNodesNotInSync,
			s:        Summary{Warm: true, Active: 1, Others: []NodeState{{"node-a", stats.RedirectSyncing, "starting"}, {"node-b", Silent, "no report"}}},
			contains: []string{"2 nodes: node-a (syncing: starting), node-b (silent: no report)"}},
		{name: "many nodes are cut", s: Summary{Warm: true, Others: many}, svc: svc, wantOK: true, status: metav1.ConditionFalse, reason: ReasonNotOnEveryNode,
			contains: []string{"5 nodes: n1 (", "n3 (", " and 2 more"}, excludes: []string{"n4"}},
	}
	for _, tt := range tests {
		st, reason, msg, ok := Condition(tt.s, tt.svc, 80)
		if ok != tt.wantOK || (ok && (st != tt.status || reason != tt.reason)) {
			t.Errorf("%s: %v %s %q ok=%v; want %v %s ok=%v", tt.name, st, reason, msg, ok, tt.status, tt.reason, tt.wantOK)
			continue
		}
		for _, c := range tt.contains {
			if !strings.Contains(msg, c) {
				t.Errorf("%s: message %q does not say %q", tt.name, msg, c)
			}
		}
		for _, c := range tt.excludes {
			if strings.Contains(msg, c) {
				t.Errorf("%s: message %q says %q", tt.name, msg, c)
			}
		}
	}
}

func TestNotifierSendsOnChange(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	tr := NewTracker(clk)
	c := make(chan event.GenericEvent, 1)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() {
		done <- (&Notifier{Tracker: tr, C: c, Clock: clk, Period: time.Second, MinInterval: time.Second}).Start(ctx)
	}()
	tick := func() {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !clk.HasWaiters() {
			if time.Now().After(deadline) {
				t.Fatal("the notifier never waited on its ticker")
			}
			time.Sleep(time.Millisecond)
		}
		clk.Step(time.Second)
		time.Sleep(20 * time.Millisecond) // let it look (only the "not sent" checks rely on this)
	}
	sent := func() bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	// waitSent waits for an event: under load the notifier may look late.
	waitSent := func() bool {
		select {
		case <-c:
			return true
		case <-time.After(5 * time.Second):
			return false
		}
	}
	tick()
	if sent() {
		t.Error("sent with nothing changed")
	}
	tr.Record(batch("node-a", stats.RedirectActive, ""))
	tick()
	if !waitSent() {
		t.Error("did not send when the first node reported")
	}
	tr.Record(batch("node-a", stats.RedirectActive, ""))
	tr.Record(batch("node-b", stats.RedirectActive, ""))
	tick()
	if sent() {
		t.Error("sent when only the number of active nodes changed")
	}
	tr.Record(batch("node-b", stats.RedirectSyncing, "watch Services: forbidden"))
	tick()
	tr.Record(batch("node-b", stats.RedirectOff, "--socket-redirect=off"))
	tick() // the channel is full: this send must not block
	if !waitSent() || sent() {
		t.Error("want exactly one event waiting after two changes")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Start: %v", err)
	}
}

// TestNotifierHoldsChangesWithinMinInterval: a node that flaps makes one
// event per MinInterval, not one per change.
func TestNotifierHoldsChangesWithinMinInterval(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	tr := NewTracker(clk)
	c := make(chan event.GenericEvent, 1)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		_ = (&Notifier{Tracker: tr, C: c, Clock: clk, Period: time.Second, MinInterval: 5 * time.Second}).Start(ctx)
	}()
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	// step advances the clock one period at a time and says whether the
	// notifier sent an event at the end of it; an expected event is
	// waited for longer, as the notifier may look late under load.
	step := func(d time.Duration, expected bool) bool {
		for range int(d / time.Second) {
			clk.Step(time.Second)
			time.Sleep(20 * time.Millisecond)
		}
		wait := 50 * time.Millisecond
		if expected {
			wait = 5 * time.Second
		}
		select {
		case <-c:
			return true
		case <-time.After(wait):
			return false
		}
	}
	tr.Record(batch("node-a", stats.RedirectActive, ""))
	if !step(time.Second, true) {
		t.Fatal("the first change was not sent at once")
	}
	states := []stats.RedirectState{stats.RedirectSyncing, stats.RedirectActive, stats.RedirectOff}
	for _, st := range states { // three changes, a second apart
		tr.Record(batch("node-a", st, "flap"))
		if step(time.Second, false) {
			t.Fatalf("a change to %s was sent within 5 s of the last event", st)
		}
	}
	if !step(2*time.Second, true) {
		t.Error("the held change was not sent once 5 s had passed")
	}
}
