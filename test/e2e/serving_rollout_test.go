package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// TestE2EServingRollout: a Service with rollout-duration 60s moves its
// traffic from v1 to v2 gradually, and every step of the schedule holds
// for new connections, under steady load, with no request failed.
//
// Each Revision keeps exactly one pod while routed (min-scale = max-scale
// = 1, a concurrency target of 100 the load never nears) and serves with
// no activator in its path (target-burst-capacity 0): a connection the
// kernel split to a Revision's public Service goes to that Revision's pod
// through kube-proxy, so what the in-node clients measure is the agents'
// split alone. A 10 s window lets v1 scale to zero soon after it loses
// its last share.
//
// Load, for the whole run: on every node an in-node client (in a pod's
// netns and cgroup, where the node's connect4 program sees its connects)
// opens a new connection to the Route's address every 25 ms with one GET
// on it (40/s per node, 80/s over two), and the test process, on no node,
// one every 50 ms (20/s) through kube-proxy to the activators' route port,
// where the activators split per request.
//
// Asserted: every connection is answered 200 by a pod of v1 or v2; every
// in-node connect was rewritten by the kernel (its socket's destination is
// a Revision's public Service, or an activator, never the Route's
// address; one split to a Revision but answered by the other is counted
// and logged); in every window of the schedule (status.traffic as this
// test's watch saw it change; a window starts 300 ms after a change, steps
// shorter than 3 s are merged, 6 s for the outside client's quarter of
// the rate) the share of connections answered by v2 is within
// shareTolerance of the scheduled percent, and over all the windows of the
// rollout within rolloutTotal's tolerance, for the in-node clients
// together and for the outside client; every status.traffic sums to
// 100 %; the rollout starts at 1 %, never goes back, passes through
// intermediate steps, takes at least half of rollout-duration and reaches
// 100 % within rollout-duration + 30 s of the template change;
// the Route's and the Service's Ready go through Unknown RolloutInProgress,
// never False, and end True; v1 then becomes reserve, its PodAutoscaler
// Unreachable, and has no pod left within 75 s of the end of the rollout:
// 10 s for its window to empty, the 30 s scale-to-zero grace period, the
// app's 3 s shutdown delay and 30 s of slack for reconciles on a loaded
// machine.
func TestE2EServingRollout(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	const (
		name                    = "roll"
		duration                = 60 * time.Second
		nodeEvery, outsideEvery = 25 * time.Millisecond, 50 * time.Millisecond
		lag                     = 300 * time.Millisecond
		minWindow               = 3 * time.Second
		zeroBound               = 75 * time.Second
	)
	v1Name, v2Name := name+"-00001", name+"-00002"
	svc := servingService(name, "v1", map[string]string{
		"autoscaling.knative.dev/min-scale":             "1",
		"autoscaling.knative.dev/max-scale":             "1",
		"autoscaling.knative.dev/target":                "100",
		"autoscaling.knative.dev/target-burst-capacity": "0",
		"autoscaling.knative.dev/window":                "10s",
	})
	svc.Annotations = map[string]string{servingv1alpha1.RolloutDurationAnnotation: "60s"}
	createServing(t, s, svc)
	w := watchServing(t, s, name)
	v1 := waitLatestReady(t, s, name, v1Name, 3*time.Minute)
	waitRouteTraffic(t, s, name, v1Name+" 100%", time.Minute)
	routeAddr, v1Addr := addressOf(t, s, name), addressOf(t, s, v1.Status.ServiceName)
	var rt servingv1alpha1.Route
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: name}, &rt); err != nil {
		t.Fatal(err)
	}
	if got := rt.Annotations[servingv1alpha1.RolloutDurationAnnotation]; got != "60s" {
		t.Errorf("the Route's %s is %q, want the Service's \"60s\" copied", servingv1alpha1.RolloutDurationAnnotation, got)
	}
	t.Logf("Route %s before the change: traffic [%s], annotations %v", name, stack.TrafficLine(rt.Status.Traffic), rt.Annotations)

	var nodes corev1.NodeList
	if err := s.Client.List(ctx, &nodes); err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) < 2 {
		t.Fatalf("%d nodes, want at least 2: the split is each node's agent's", len(nodes.Items))
	}
	var inNode []*servingClient
	for _, n := range nodes.Items {
		box := newClientSandbox(t, s, "roll-client", n.Name)
		inNode = append(inNode, box.start(t, servingClientConfig{Targets: []netip.AddrPort{routeAddr}, Every: nodeEvery}))
	}
	outside := startOutsideClient(t, servingClientConfig{Targets: []netip.AddrPort{routeAddr}, Every: outsideEvery})
	everyone := append(slices.Clone(inNode), outside)
	defer func() {
		for _, c := range everyone {
			c.stop()
		}
	}()
	e2etest.Eventually(t, 30*time.Second, "every client answered by "+v1Name+", the in-node ones split by the kernel", func() error {
		for _, c := range everyone {
			rs := c.results()
			if len(rs) < 20 {
				return fmt.Errorf("%s: %d connections so far", c.who, len(rs))
			}
			for _, r := range rs[len(rs)-10:] {
				if r.Err != "" || r.revision() != v1Name || (c != outside && r.Dest != v1Addr) {
					return fmt.Errorf("%s: a connection at %s went to %s and got %s (want %s's pod, and for an in-node client the kernel's rewrite to %s); %s",
						c.who, r.At.Format("15:04:05.000"), r.Dest, connLine(r), v1Name, v1Addr, servingDiag(ctx, s, name))
				}
			}
		}
		return nil
	})
	measureFrom := time.Now()
	time.Sleep(5 * time.Second) // a window of v1 alone

	t0 := time.Now()
	updateService(t, s, name, func(cur *servingv1alpha1.Service) { cur.Spec.Template.Spec.Containers[0].Env[0].Value = "v2" })
	t.Cleanup(func() {
		if t.Failed() { // the pace the rollout kept, step by step
			var line []string
			for _, st := range steps(w.trafficChanges(), v2Name) {
				line = append(line, fmt.Sprintf("%+.1fs %d%%", st.at.Sub(t0).Seconds(), st.percent))
			}
			t.Logf("schedule of %s's share so far: %s", v2Name, strings.Join(line, ", "))
			// A slow pace is the controller's: its errors, retries and
			// client-side throttling.
			logLines(t, s, "controller", "rror", "onflict", "hrottl", "Waited for")
		}
	})
	v2 := waitLatestReady(t, s, name, v2Name, 2*time.Minute)
	v2Ready := time.Now()
	if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: name}, &rt); err == nil {
		t.Logf("Route %s when %s became ready (%.1fs): traffic [%s], annotations %v", name, v2Name, v2Ready.Sub(t0).Seconds(), stack.TrafficLine(rt.Status.Traffic), rt.Annotations)
	}
	v2Addr := addressOf(t, s, v2.Status.ServiceName)
	var full time.Time
	e2etest.Poll(t, duration+time.Minute, 100*time.Millisecond, "the Route's status.traffic at 100 % "+v2Name, func() error {
		sched := steps(w.trafficChanges(), v2Name)
		if len(sched) == 0 || sched[len(sched)-1].percent != 100 {
			return fmt.Errorf("%s's share not 100 %%: %s", v2Name, servingDiag(ctx, s, name))
		}
		full = sched[len(sched)-1].at
		return nil
	})
	e2etest.Eventually(t, 15*time.Second, "Route and Service Ready after the rollout", func() error {
		var rt servingv1alpha1.Route
		var sv servingv1alpha1.Service
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: name}, &rt); err != nil {
			return err
		}
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: name}, &sv); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(rt.Status.Conditions, "Ready") || !meta.IsStatusConditionTrue(sv.Status.Conditions, "Ready") {
			return fmt.Errorf("not both Ready: %s", servingDiag(ctx, s, name))
		}
		return nil
	})
	waitRevisionAtZero(t, s, v1Name, zeroBound-time.Since(full), func(r *servingv1alpha1.Revision) error {
		pa, err := s.PA(ctx, appNS, v1Name)
		if err != nil {
			return err
		}
		if r.Status.RoutingState != servingv1alpha1.RoutingStateReserve || pa.Spec.Reachability != v1alpha1.ReachabilityUnreachable {
			return fmt.Errorf("routing state %q, PodAutoscaler reachability %q: want reserve and Unreachable once no Route sends it traffic", r.Status.RoutingState, pa.Spec.Reachability)
		}
		return nil
	})
	zero := time.Now()
	time.Sleep(2 * time.Second) // load on v2 alone, v1 gone
	end := time.Now()
	for _, c := range everyone {
		c.stop()
	}

	changes := w.trafficChanges()
	for _, c := range changes {
		var sum int64
		for _, tt := range c.traffic {
			sum += ptr.Deref(tt.Percent, 0)
		}
		if len(c.traffic) > 0 && sum != 100 {
			t.Errorf("status.traffic at %+.1fs sums to %d %%: [%s]", c.at.Sub(t0).Seconds(), sum, stack.TrafficLine(c.traffic))
		}
	}
	sched := steps(changes, v2Name)
	var line []string
	for _, st := range sched {
		line = append(line, fmt.Sprintf("%+.1fs %d%%", st.at.Sub(t0).Seconds(), st.percent))
	}
	t.Logf("schedule of %s's share (status.traffic as seen, from the template change): %s", v2Name, strings.Join(line, ", "))

	// Every connection answered by v1 or v2, and the kernel split every
	// in-node one after the warm-up.
	var kernel []connResult
	for _, c := range everyone {
		rs := c.results()
		var failed, strangers, resplit []string
		var notSplit, viaActivator, split int
		for _, r := range rs {
			switch {
			case r.Err != "":
				failed = append(failed, fmt.Sprintf("%+.3fs: %s", r.At.Sub(t0).Seconds(), r.Err))
				continue
			case r.revision() != v1Name && r.revision() != v2Name:
				strangers = append(strangers, r.Pod)
				continue
			}
			if c == outside || r.At.Before(measureFrom) {
				continue
			}
			kernel = append(kernel, r)
			switch {
			case r.Dest == routeAddr:
				if notSplit++; notSplit <= 3 {
					t.Errorf("%s: the connect at %+.3fs kept the Route's address %s: the kernel did not split it", c.who, r.At.Sub(t0).Seconds(), r.Dest)
				}
			case r.Dest == v1Addr && r.revision() != v1Name, r.Dest == v2Addr && r.revision() != v2Name:
				// Not a failure: while a Revision's public Service still
				// leads to the activators (kube-proxy not yet following
				// its switch to Serve mode), the activator there sees the
				// Route's Host only and splits again by the percents,
				// exact in expectation (docs/serving.md).
				resplit = append(resplit, fmt.Sprintf("%+.3fs to %s answered by %s", r.At.Sub(t0).Seconds(), r.Dest, r.Pod))
			case r.Dest == v1Addr, r.Dest == v2Addr:
				split++
			case r.Dest.Port() == stack.ActivatorProxyPort:
				viaActivator++
			default:
				t.Errorf("%s: the connect at %+.3fs went to %s, neither a Revision's public Service (%s, %s) nor an activator", c.who, r.At.Sub(t0).Seconds(), r.Dest, v1Addr, v2Addr)
			}
		}
		line := fmt.Sprintf("%s: %d connections, %d failed, %d answered by neither revision", c.who, len(rs), len(failed), len(strangers))
		if c != outside {
			line += fmt.Sprintf("; after the warm-up the kernel split %d to a Revision's public Service and %d to an activator (second hop), %d not split; %d split to one Revision and answered by the other %q",
				split, viaActivator, notSplit, len(resplit), resplit[:min(5, len(resplit))])
		}
		t.Log(line)
		if len(failed) > 0 {
			t.Errorf("%s: %d of %d connections failed, e.g. %q", c.who, len(failed), len(rs), failed[:min(5, len(failed))])
		}
		if len(strangers) > 0 {
			t.Errorf("%s: %d connections answered by pods of neither %s nor %s, e.g. %q", c.who, len(strangers), v1Name, v2Name, strangers[:min(5, len(strangers))])
		}
	}

	// The share, window by window.
	for _, m := range []struct {
		who       string
		conns     []connResult
		minWindow time.Duration
	}{{fmt.Sprintf("in-node clients on %d nodes (the agents' kernel split)", len(inNode)), kernel, minWindow},
		// A quarter of the in-node rate: windows twice as long.
		{"outside client (kube-proxy to the activators' route port, split per request)", outside.results(), 2 * minWindow}} {
		ws := shareWindows(sched, m.conns, v2Name, lag, m.minWindow, measureFrom, end)
		total := rolloutTotal(ws)
		t.Logf("%s: share of new connections answered by %s; windows from %s after each change, steps merged into at least %s; times from the template change:\n%s",
			m.who, v2Name, lag, m.minWindow, shareTable(ws, total, t0))
		if total.n > 0 { // none without a rollout, which is reported below
			ws = append(ws, total)
		}
		for _, sw := range ws {
			if sw.n == 0 {
				t.Errorf("%s: no connection in the window %+.1fs..%+.1fs", m.who, sw.from.Sub(t0).Seconds(), sw.to.Sub(t0).Seconds())
			} else if !sw.ok() {
				t.Errorf("%s: window %+.1fs..%+.1fs (%d steps): %.1f %% answered by %s of %d connections, scheduled %.1f %%, tolerance %.1f points",
					m.who, sw.from.Sub(t0).Seconds(), sw.to.Sub(t0).Seconds(), sw.steps, sw.measured, v2Name, sw.n, sw.scheduled, sw.tol)
			}
		}
	}

	// The rollout's course.
	first := slices.IndexFunc(sched, func(st trafficStep) bool { return st.percent > 0 })
	last := slices.IndexFunc(sched, func(st trafficStep) bool { return st.percent == 100 })
	if first < 0 || last < first {
		t.Fatalf("no rollout in the schedule %v", line)
	}
	rolled := sched[last].at.Sub(sched[first].at)
	var middle int
	for _, st := range sched[first:last] {
		if st.percent > 0 && st.percent < 100 {
			middle++
		}
	}
	t.Logf("rollout: %s ready %.1fs after the template change; its first share (%d %%) seen %.1fs after, 100 %% %.1fs after: %.1fs over %d intermediate steps (rollout-duration %s); %s at zero %.1fs after the 100 %%",
		v2Name, v2Ready.Sub(t0).Seconds(), sched[first].percent, sched[first].at.Sub(t0).Seconds(), full.Sub(t0).Seconds(), rolled.Seconds(), middle, duration, v1Name, zero.Sub(full).Seconds())
	if sched[first].percent != 1 || middle < 2 {
		t.Logf("the controllers' log on Routes and rollouts:\n%s", controllerLog(func(l string) bool {
			return strings.Contains(l, `"name":"`+name+`"`) && (strings.Contains(l, "serving-route") || strings.Contains(strings.ToLower(l), "rollout"))
		}, 20))
	}
	if sched[first].percent != 1 {
		t.Errorf("the rollout's first step gave %s %d %%, want 1 %% (docs/serving.md)", v2Name, sched[first].percent)
	}
	// Timed from the first 1 %: how long the new revision takes to be
	// ready is the node's, not the rollout's. Each step is timed from the
	// reconcile that made the one before, so a late reconcile (a busy
	// API server, a controller handing over its lease while other tests
	// reinstall the chart) delays the rest: 30 s of slack.
	if rolled > duration+30*time.Second {
		t.Errorf("100 %% on %s %s after its first step, want within rollout-duration + 30 s = %s", v2Name, rolled.Round(100*time.Millisecond), duration+30*time.Second)
		t.Logf("the controllers' log on Routes, rollouts and leases:\n%s", controllerLog(func(l string) bool {
			return (strings.Contains(l, `"name":"`+name+`"`) && strings.Contains(l, "serving-route")) || strings.Contains(strings.ToLower(l), "leader")
		}, 40))
	}
	if rolled < duration/2 {
		t.Errorf("the rollout took %s from its first step to 100 %%, want at least half of rollout-duration %s: not gradual", rolled.Round(100*time.Millisecond), duration)
	}
	if middle < 2 {
		t.Errorf("the rollout had %d intermediate steps, want a gradual one (at least 2): %v", middle, line)
	}
	for i := first; i < last; i++ {
		if sched[i+1].percent < sched[i].percent {
			t.Errorf("%s's share went back from %d %% to %d %% at %+.1fs", v2Name, sched[i].percent, sched[i+1].percent, sched[i+1].at.Sub(t0).Seconds())
		}
	}

	// Ready during the rollout.
	var readyLog []string
	for _, kind := range []string{"Route", "Service"} {
		rolling := false
		for _, r := range w.readyChanges() {
			if r.kind != kind || r.at.Before(t0) {
				continue
			}
			readyLog = append(readyLog, fmt.Sprintf("%+.1fs %s %s %s", r.at.Sub(t0).Seconds(), kind, r.status, r.reason))
			if r.status == metav1.ConditionUnknown && r.reason == "RolloutInProgress" && !r.at.After(full.Add(time.Second)) {
				rolling = true
			}
			if r.status == metav1.ConditionFalse {
				t.Errorf("%s Ready False during the rollout at %+.1fs: %s: %s", kind, r.at.Sub(t0).Seconds(), r.reason, r.message)
			}
		}
		if !rolling {
			t.Errorf("%s Ready was never Unknown RolloutInProgress between the template change and the 100 %% step", kind)
		}
	}
	t.Logf("Ready from the template change: %s", strings.Join(readyLog, "; "))
}

// TestE2EServingTags: a Service's split [{latestRevision, 100 %, tag
// current}, {v1, 0 %, tag old}] gives each tag an address that reaches its
// Revision whatever its percent, from an in-node client (the kernel
// rewrites the tag's address to its Revision's) and from the test process
// on no node (kube-proxy to the activators' route port, where the
// activator resolves the tag's address). v1 at 0 % with min-scale 0
// scales to zero, and a request to old-<svc> wakes it through an activator
// and is answered 200 by a v1 pod: once from the test process, once from
// the in-node client, whose connect the kernel sends in two hops (the
// tag's address to v1's public Service, which in Proxy mode leads to an
// activator's proxy port).
func TestE2EServingTags(t *testing.T) {
	s := up(t)
	ctx := context.Background()
	const name = "tags"
	v1Name, v2Name := name+"-00001", name+"-00002"
	// A 10 s window: v1 is at zero about 40 s after its last request (the
	// window, then the 30 s grace period, already in Proxy mode with the
	// default target-burst-capacity).
	createServing(t, s, servingService(name, "v1", map[string]string{
		"autoscaling.knative.dev/min-scale": "0",
		"autoscaling.knative.dev/window":    "10s",
	}))
	waitLatestReady(t, s, name, v1Name, 3*time.Minute)
	updateService(t, s, name, func(cur *servingv1alpha1.Service) {
		cur.Spec.Template.Spec.Containers[0].Env[0].Value = "v2"
		cur.Spec.Template.Metadata.Annotations["autoscaling.knative.dev/min-scale"] = "1"
	})
	waitLatestReady(t, s, name, v2Name, 3*time.Minute)
	updateService(t, s, name, func(cur *servingv1alpha1.Service) {
		cur.Spec.Traffic = []servingv1alpha1.TrafficTarget{
			{Tag: "current", LatestRevision: ptr.To(true), Percent: ptr.To(int64(100))},
			{Tag: "old", RevisionName: v1Name, Percent: ptr.To(int64(0))},
		}
	})
	waitRouteTraffic(t, s, name, "current:"+v2Name+" 100%, old:"+v1Name+" 0%", time.Minute)
	current, old := "current-"+name, "old-"+name
	for tag, svcName := range map[string]string{"current": current, "old": old} {
		var a corev1.Service
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: svcName}, &a); err != nil {
			t.Fatalf("tag %s's address Service %s: %v; %s", tag, svcName, err, servingDiag(ctx, s, name))
		}
		if a.Labels[servingv1alpha1.TagLabelKey] != tag || a.Labels[servingv1alpha1.RouteLabelKey] != name {
			t.Errorf("Service %s's labels %v, want %s=%s and %s=%s", svcName, a.Labels, servingv1alpha1.TagLabelKey, tag, servingv1alpha1.RouteLabelKey, name)
		}
	}
	addr := map[string]netip.AddrPort{name: addressOf(t, s, name), current: addressOf(t, s, current), old: addressOf(t, s, old)}
	e2etest.Eventually(t, 30*time.Second, "the Route's addresses lead to the activators' route port", func() error {
		for n := range addr {
			if err := expectRouteEndpoints(ctx, s, n); err != nil {
				return err
			}
		}
		return nil
	})
	// A tag routes v1 (active, reachable) though at 0 %: min-scale 0
	// alone takes it to zero.
	routedByTag := func(r *servingv1alpha1.Revision) error {
		pa, err := s.PA(ctx, appNS, v1Name)
		if err != nil {
			return err
		}
		if r.Status.RoutingState != servingv1alpha1.RoutingStateActive || pa.Spec.Reachability == v1alpha1.ReachabilityUnreachable {
			return fmt.Errorf("routing state %q, PodAutoscaler reachability %q: want active and reachable, the tag old routes it", r.Status.RoutingState, pa.Spec.Reachability)
		}
		return nil
	}
	waitRevisionAtZero(t, s, v1Name, 2*time.Minute, routedByTag)
	forwarded := map[string]string{"namespace": appNS, "name": v1Name, "result": "forwarded"}
	expect := func(who, target string, r connResult, rev string) {
		t.Helper()
		if r.Err != "" || r.revision() != rev {
			t.Errorf("%s, %s at %s: %s, want 200 from a pod of %s; %s", who, target, addr[target], connLine(r), rev, servingDiag(ctx, s, name))
			return
		}
		t.Logf("%s, %s at %s: answered by %s in %s (destination %s)", who, target, addr[target], r.Pod, r.Took.Round(time.Millisecond), r.Dest)
	}

	// From the test process, on no node: the activator wakes v1.
	_, before, err := activatorSum(ctx, s, "sockscale_activator_hold_results_total", forwarded)
	if err != nil {
		t.Fatal(err)
	}
	// kube-proxy has old's rules once a connection is accepted (by an
	// activator); no request is sent yet.
	e2etest.Eventually(t, 30*time.Second, "kube-proxy leads "+old+" to an activator", func() error {
		conn, err := net.DialTimeout("tcp", addr[old].String(), time.Second)
		if err != nil {
			return err
		}
		return conn.Close()
	})
	expect("outside (at zero)", old, oneConn(addr[old], "", false, time.Minute), v1Name)
	if _, after, err := activatorSum(ctx, s, "sockscale_activator_hold_results_total", forwarded); err != nil || after < before+1 {
		t.Errorf("the activators forwarded %v requests to %s for the wake (%v), want 1", after-before, v1Name, err)
	}
	expect("outside", current, oneConn(addr[current], "", false, loadTimeout), v2Name)
	expect("outside", name, oneConn(addr[name], "", false, loadTimeout), v2Name)

	// From a node: the kernel rewrites each address.
	var nodes corev1.NodeList
	if err := s.Client.List(ctx, &nodes); err != nil || len(nodes.Items) == 0 {
		t.Fatalf("nodes: %d, %v", len(nodes.Items), err)
	}
	box := newClientSandbox(t, s, "tags-client", nodes.Items[0].Name)
	who := "in-node on " + box.node
	for i, r := range box.once(t, loadTimeout, addr[name], addr[current], addr[old]) {
		target, rev := []string{name, current, old}[i], []string{v2Name, v2Name, v1Name}[i]
		expect(who, target, r, rev)
		if r.Err == "" && r.Dest == addr[target] {
			t.Errorf("%s: the connect to %s (%s) kept its address: the kernel did not rewrite it", who, target, r.Dest)
		}
	}

	// Back to zero, then woken from the node: two hops in the kernel.
	waitRevisionAtZero(t, s, v1Name, 2*time.Minute, routedByTag)
	if _, before, err = activatorSum(ctx, s, "sockscale_activator_hold_results_total", forwarded); err != nil {
		t.Fatal(err)
	}
	r := box.once(t, time.Minute, addr[old])[0]
	expect(who+" (at zero)", old, r, v1Name)
	acts, err := s.Activators(ctx)
	if err != nil {
		t.Fatal(err)
	}
	toActivator := slices.ContainsFunc(acts, func(a stack.ActivatorPod) bool { return a.IP == r.Dest.Addr() }) && r.Dest.Port() == stack.ActivatorProxyPort
	if r.Err == "" && !toActivator {
		t.Errorf("%s: the connect to %s at zero went to %s, want an activator's proxy port %d (the tag's address to %s's public Service, in Proxy mode an activator)", who, old, r.Dest, stack.ActivatorProxyPort, v1Name)
	}
	if _, after, err := activatorSum(ctx, s, "sockscale_activator_hold_results_total", forwarded); err != nil || after < before+1 {
		t.Errorf("the activators forwarded %v requests to %s for the wake from the node (%v), want 1", after-before, v1Name, err)
	}
}

// connLine is a connection's outcome in a few words.
func connLine(r connResult) string {
	if r.Err != "" {
		return "error after " + r.Took.Round(time.Millisecond).String() + ": " + r.Err
	}
	return fmt.Sprintf("%d from %s", r.Code, r.Pod)
}
