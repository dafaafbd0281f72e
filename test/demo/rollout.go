package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/test/stack"
)

// The rollout scene's settings.
const (
	rolloutSvc      = "web"
	rolloutDuration = "60s" // the Service's rollout-duration annotation
	// The load: on every node a new connection every clientEvery (20/s
	// per node) with one GET that takes 200 ms at the pod: 8 requests in
	// flight on two nodes, about 4 pods at a target of 3 per pod (70 %
	// of it: 2.1).
	clientEvery = 50 * time.Millisecond
	clientPath  = "/?sleep=200"
	// rolloutWarmup is the load on v1 alone before the template change:
	// v1 scales to the load.
	rolloutWarmup = 20 * time.Second
	// The lines go on for rolloutShow after the change, longer while
	// the rollout has not reached 100 % (plus rolloutAfter), at most
	// rolloutMax.
	rolloutShow  = 75 * time.Second
	rolloutAfter = 5 * time.Second
	rolloutMax   = 150 * time.Second
	// lineLag is how long after a second ends its line is printed: its
	// connections' answers take 200 ms and more.
	lineLag = 800 * time.Millisecond
)

// servingService is the scene's Service: the test app, GREETING set to
// greeting (changing it makes a Revision), one pod at least while routed,
// a concurrency target of 3 per pod and a 10 s window, and traffic moved
// to a new Revision over rolloutDuration.
func servingService(greeting string) *servingv1alpha1.Service {
	return &servingv1alpha1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: appNS, Name: rolloutSvc, Annotations: map[string]string{
			servingv1alpha1.RolloutDurationAnnotation: rolloutDuration,
		}},
		Spec: servingv1alpha1.ServiceSpec{Template: servingv1alpha1.RevisionTemplateSpec{
			Metadata: servingv1alpha1.RevisionTemplateMetadata{Annotations: map[string]string{
				"autoscaling.knative.dev/min-scale":             "1",
				"autoscaling.knative.dev/max-scale":             "6",
				"autoscaling.knative.dev/target":                "3",
				"autoscaling.knative.dev/window":                "10s",
				"autoscaling.knative.dev/target-burst-capacity": "0",
			}},
			Spec: servingv1alpha1.RevisionSpec{Containers: []servingv1alpha1.Container{{
				Image: stack.AppImage,
				Env:   []corev1.EnvVar{{Name: "GREETING", Value: greeting}},
			}}},
		}},
	}
}

// rolloutScene runs the scene and returns what it measured, also when it
// fails (then with an error saying what it waited for and what it saw).
type rolloutScene struct {
	s      *stack.Stack
	wc     client.WithWatch
	w      io.Writer
	v1, v2 string
	rec    *rolloutRecord
	t0     time.Time // the template change
	route  *routeWatch
	conns  connLog
}

func (sc *rolloutScene) say(format string, args ...any) {
	fmt.Fprintf(sc.w, "==> rollout: "+format+"\n", args...)
}

// runRollout: a serving Service (v1) with rollout-duration 60s, steady
// load of new connections from in-node clients to its Route's address,
// then a template change (v2) and a line per second while traffic moves.
func runRollout(ctx context.Context, s *stack.Stack, wc client.WithWatch, w io.Writer) (*rolloutRecord, error) {
	sc := &rolloutScene{s: s, wc: wc, w: w, v1: rolloutSvc + "-00001", v2: rolloutSvc + "-00002"}
	sc.rec = &rolloutRecord{V1: sc.v1, V2: sc.v2}
	err := sc.run(ctx)
	sc.finish()
	return sc.rec, err
}

func (sc *rolloutScene) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sc.say("serving Service %s/%s (%s: %s; min-scale 1, target 3 per pod, window 10s) running the test app with GREETING=v1",
		appNS, rolloutSvc, servingv1alpha1.RolloutDurationAnnotation, rolloutDuration)
	var err error
	if sc.route, err = watchRoute(ctx, sc.wc, rolloutSvc); err != nil {
		return fmt.Errorf("watch Route %s/%s: %w", appNS, rolloutSvc, err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: appNS}}
	if err := sc.s.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", appNS, err)
	}
	if err := sc.s.Client.Create(ctx, servingService("v1")); err != nil {
		return fmt.Errorf("create serving Service %s/%s: %w", appNS, rolloutSvc, err)
	}
	// The client pods start while v1 comes up.
	var nodes corev1.NodeList
	if err := sc.s.Client.List(ctx, &nodes); err != nil {
		return fmt.Errorf("list nodes: %w", err)
	}
	var pods []*corev1.Pod
	defer func() {
		if err := deletePods(sc.s, pods); err != nil {
			sc.say("%v", err)
		}
	}()
	for _, n := range nodes.Items {
		p := clientPod(n.Name)
		if err := sc.s.Client.Create(ctx, p); err != nil {
			return fmt.Errorf("create client pod %s: %w", p.Name, err)
		}
		pods = append(pods, p)
	}
	start := time.Now()
	if err := sc.waitV1(ctx, 3*time.Minute); err != nil {
		return err
	}
	routeAddr, err := sc.address(ctx, rolloutSvc)
	if err != nil {
		return err
	}
	v1Addr, err := sc.revisionAddress(ctx, sc.v1)
	if err != nil {
		return err
	}
	sc.say("%s ready in %s; Route %s: %s 100 %%, address %s (%s's public Service: %s)", sc.v1, time.Since(start).Round(time.Second), rolloutSvc, sc.v1, routeAddr, sc.v1, v1Addr)

	var clients []*nodeClient
	defer func() {
		for _, c := range clients {
			if err := c.stop(); err != nil {
				sc.say("%v", err)
			}
		}
	}()
	cfg := clientConfig{Addr: routeAddr, Path: clientPath, Every: clientEvery, Timeout: 10 * time.Second}
	for _, p := range pods {
		netns, cgroup, err := sandbox(ctx, sc.s, p, time.Minute)
		if err != nil {
			return err
		}
		c, err := startClient(p.Spec.NodeName, netns, cgroup, cfg, &sc.conns)
		if err != nil {
			return err
		}
		clients = append(clients, c)
	}
	sc.say("in-node clients on %d nodes (each in pod %s-<node>'s network namespace and cgroup, where the node's agent's connect4 program sees its connects): a new connection to %s every %s each, one GET %s on it",
		len(clients), clientPodPrefix, routeAddr, clientEvery, clientPath)

	// From here the lines: a warm-up on v1 alone, the template change at
	// t0, then the rollout.
	sc.t0 = time.Now().Add(rolloutWarmup)
	sc.say("a line per second: the connections started in that second (by the clients' clocks); the split in effect at its end, from the Route's status.traffic (*: it changed during the second); ready pods when the line is printed; times from the template change")
	fmt.Fprintf(sc.w, "%s", rolloutHeaderLine())
	changed, v2Ready, full := false, false, time.Duration(-1)
	var v2Addr netip.AddrPort
	for k := -int(rolloutWarmup / time.Second); ; k++ {
		printAt := sc.t0.Add(time.Duration(k+1)*time.Second + lineLag)
		if !changed && printAt.After(sc.t0) {
			if err := sleepUntil(ctx, sc.t0); err != nil {
				return err
			}
			sc.say("changing the template: GREETING=v2 (a new Revision, %s; traffic moves to it over %s once it is ready)", sc.v2, rolloutDuration)
			if err := sc.changeTemplate(ctx); err != nil {
				return err
			}
			sc.rec.Markers = append(sc.rec.Markers, Marker{At: time.Since(sc.t0), Label: "template changed"})
			changed = true
		}
		if err := sleepUntil(ctx, printAt); err != nil {
			return err
		}
		sc.syncSteps()
		pods := sc.pods(ctx)
		sc.rec.Pods = append(sc.rec.Pods, pods)
		sec := bin(sc.conns.all(), sc.t0, sc.v1, sc.v2, k, k+1)[0]
		fmt.Fprintf(sc.w, "%s", rolloutLine(sec, sc.rec.Steps, pods))
		if changed && !v2Ready {
			if ready, _ := sc.revisionReady(ctx, sc.v2); ready {
				v2Ready = true
				sc.rec.Markers = append(sc.rec.Markers, Marker{At: time.Since(sc.t0), Label: sc.v2 + " ready"})
				if v2Addr, err = sc.revisionAddress(ctx, sc.v2); err != nil {
					return err
				}
			}
		}
		if full < 0 {
			if st, ok := splitAt(sc.rec.Steps, pods.At); ok && st.V2 == 100 {
				full = st.At
				sc.rec.Markers = append(sc.rec.Markers, Marker{At: st.At, Label: "100 % " + sc.v2})
			}
		}
		elapsed := time.Duration(k+1) * time.Second
		if elapsed >= rolloutShow && full >= 0 && elapsed >= full+rolloutAfter {
			break
		}
		if elapsed >= rolloutMax {
			return fmt.Errorf("waited %s after the template change for the Route's status.traffic to give %s 100 %%; saw the schedule %s; %s",
				rolloutMax, sc.v2, stepsLine(sc.rec.Steps), sc.diag(ctx))
		}
	}
	for _, c := range clients {
		if err := c.stop(); err != nil {
			return err
		}
	}
	sc.summary(routeAddr, map[netip.AddrPort]string{v1Addr: sc.v1, v2Addr: sc.v2})
	return nil
}

// finish fills the record from every connection measured: the seconds
// from the first line's to the last line's, now that their late answers
// are in.
func (sc *rolloutScene) finish() {
	if sc.t0.IsZero() {
		return
	}
	sc.syncSteps()
	conns := sc.conns.all()
	end := time.Since(sc.t0)
	if n := len(sc.rec.Pods); n > 0 {
		end = sc.rec.Pods[n-1].At
	}
	sc.rec.End = end
	from := -int(rolloutWarmup / time.Second)
	sc.rec.Seconds = bin(conns, sc.t0, sc.v1, sc.v2, from, int(end/time.Second))
}

// syncSteps copies the Route's changes seen so far into the record.
func (sc *rolloutScene) syncSteps() {
	if sc.route == nil {
		return
	}
	sc.rec.Steps = sc.route.steps(sc.t0, sc.v1, sc.v2)
}

// summary prints, after the lines, what every connection did: the
// schedule against the measured share in 10 s windows, failures, and
// where the kernel sent the in-node connects.
func (sc *rolloutScene) summary(routeAddr netip.AddrPort, revAddrs map[netip.AddrPort]string) {
	conns := sc.conns.all()
	var v1, v2, other, failed, split, notSplit, viaActivator, elsewhere int
	var failures []string
	for _, c := range conns {
		switch rev := c.revision(); {
		case c.Err != "":
			failed++
			if len(failures) < 3 {
				failures = append(failures, fmt.Sprintf("%+.1fs on %s: %s", c.At.Sub(sc.t0).Seconds(), c.Node, c.Err))
			}
		case rev == sc.v1:
			v1++
		case rev == sc.v2:
			v2++
		default:
			other++
		}
		switch _, isRev := revAddrs[c.Dest]; {
		case !c.Dest.IsValid():
		case isRev:
			split++
		case c.Dest == routeAddr:
			notSplit++
		case c.Dest.Port() == stack.ActivatorProxyPort:
			viaActivator++
		default:
			elsewhere++
		}
	}
	sc.say("%d connections: %d answered by %s, %d by %s, %d by other pods, %d failed%s", len(conns), v1, sc.v1, v2, sc.v2, other, failed, failuresLine(failures))
	sc.say("where the kernel sent them (the socket's destination): %d to a Revision's public Service (split on the node by its agent's map), %d to an activator (a Revision at zero), %d kept the Route's address (not split: kube-proxy to the activators, which split per request), %d elsewhere",
		split, viaActivator, notSplit, elsewhere)
	sc.say("schedule (%s's percent in status.traffic, as seen): %s", sc.v2, stepsLine(sc.rec.Steps))
	ws := windows(sc.rec.Steps, conns, sc.t0, sc.v1, sc.v2, 10*time.Second, -rolloutWarmup, time.Since(sc.t0))
	fmt.Fprintf(sc.w, "%s's share in 10 s windows: scheduled (the percent in effect when each connection started, averaged) and measured (the share it answered):\n%s", sc.v2, windowTable(ws))
}

func failuresLine(fs []string) string {
	if len(fs) == 0 {
		return ""
	}
	return " (e.g. " + strings.Join(fs, "; ") + ")"
}

// stepsLine is the schedule in one line, e.g. "-20.2s 0%, 1.4s 1%,
// 2.5s 3%"; a long one keeps its first four and last two changes and
// says how many there were and how far apart.
func stepsLine(steps []splitStep) string {
	var parts []string
	var changes []splitStep
	for i, st := range steps {
		if i > 0 && st.V2 == steps[i-1].V2 {
			continue // only the Ready changed
		}
		changes = append(changes, st)
		parts = append(parts, fmt.Sprintf("%.1fs %d%%", st.At.Seconds(), st.V2))
	}
	const head, tail = 4, 2
	switch n := len(parts); {
	case n == 0:
		return "none seen"
	case n > head+tail+1:
		// The first change is the split before the rollout: the pace is
		// from the second (the first 1 %) to the last.
		every := (changes[n-1].At - changes[1].At) / time.Duration(n-2)
		return fmt.Sprintf("%s, ... %s (%d changes, one every %.1f s on average)",
			strings.Join(parts[:head], ", "), strings.Join(parts[n-tail:], ", "), n-1, every.Seconds())
	}
	return strings.Join(parts, ", ")
}

// waitV1 waits until the Service's first Revision is Ready and the Route
// gives it 100 % and is Ready.
func (sc *rolloutScene) waitV1(ctx context.Context, timeout time.Duration) error {
	return waitFor(ctx, timeout, fmt.Sprintf("Revision %s Ready and Route %s Ready with status.traffic %s 100 %%", sc.v1, rolloutSvc, sc.v1), func() (bool, string) {
		var rt servingv1alpha1.Route
		ready, _ := sc.revisionReady(ctx, sc.v1)
		if !ready {
			return false, sc.diag(ctx)
		}
		if err := sc.s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: rolloutSvc}, &rt); err != nil {
			return false, err.Error()
		}
		if stack.PercentOf(rt.Status.Traffic, sc.v1) != 100 || !meta.IsStatusConditionTrue(rt.Status.Conditions, "Ready") {
			return false, sc.diag(ctx)
		}
		return true, ""
	})
}

// revisionReady says whether the Revision is Ready.
func (sc *rolloutScene) revisionReady(ctx context.Context, name string) (bool, error) {
	var r servingv1alpha1.Revision
	if err := sc.s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: name}, &r); err != nil {
		return false, err
	}
	return meta.IsStatusConditionTrue(r.Status.Conditions, "Ready"), nil
}

// address is a Kubernetes Service's ClusterIP:80 in appNS, once it has
// one in the cluster's service range.
func (sc *rolloutScene) address(ctx context.Context, name string) (netip.AddrPort, error) {
	var addr netip.AddrPort
	err := waitFor(ctx, 30*time.Second, "Service "+name+"'s ClusterIP", func() (bool, string) {
		url, err := sc.s.PublicURL(ctx, appNS, name)
		if err != nil {
			return false, err.Error()
		}
		if addr, err = netip.ParseAddrPort(strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/")); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	return addr, err
}

// revisionAddress is a Revision's public Service's address.
func (sc *rolloutScene) revisionAddress(ctx context.Context, rev string) (netip.AddrPort, error) {
	var r servingv1alpha1.Revision
	if err := sc.s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: rev}, &r); err != nil {
		return netip.AddrPort{}, fmt.Errorf("get revision %s: %w", rev, err)
	}
	if r.Status.ServiceName == "" {
		return netip.AddrPort{}, fmt.Errorf("revision %s is Ready without status.serviceName", rev)
	}
	return sc.address(ctx, r.Status.ServiceName)
}

// changeTemplate sets GREETING=v2, retrying on conflicts with the
// controller's status writes.
func (sc *rolloutScene) changeTemplate(ctx context.Context) error {
	var last error
	for range 10 {
		var cur servingv1alpha1.Service
		if last = sc.s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: rolloutSvc}, &cur); last != nil {
			continue
		}
		cur.Spec.Template.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "GREETING", Value: "v2"}}
		if last = sc.s.Client.Update(ctx, &cur); last == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("change Service %s/%s's template: %w", appNS, rolloutSvc, last)
}

// pods counts each revision's ready pods, now.
func (sc *rolloutScene) pods(ctx context.Context) podsAt {
	p := podsAt{At: time.Since(sc.t0)}
	var list corev1.PodList
	if err := sc.s.Client.List(ctx, &list, client.InNamespace(appNS), client.HasLabels{servingv1alpha1.RevisionLabelKey}); err != nil {
		return p
	}
	for _, pod := range list.Items {
		if pod.DeletionTimestamp != nil || !podReady(&pod) {
			continue
		}
		switch pod.Labels[servingv1alpha1.RevisionLabelKey] {
		case sc.v1:
			p.V1++
		case sc.v2:
			p.V2++
		}
	}
	return p
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// diag says where the Service stands, for an error: its status, its
// Route's, and each Revision's.
func (sc *rolloutScene) diag(ctx context.Context) string {
	var b strings.Builder
	var svc servingv1alpha1.Service
	if err := sc.s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: rolloutSvc}, &svc); err != nil {
		fmt.Fprintf(&b, "Service: %v", err)
	} else {
		fmt.Fprintf(&b, "Service: latest created %q, latest ready %q, %s", svc.Status.LatestCreatedRevisionName, svc.Status.LatestReadyRevisionName, stack.ConditionsLine(svc.Status.Conditions))
	}
	var rt servingv1alpha1.Route
	if err := sc.s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: rolloutSvc}, &rt); err != nil {
		fmt.Fprintf(&b, "; Route: %v", err)
	} else {
		fmt.Fprintf(&b, "; Route: traffic [%s], %s", stack.TrafficLine(rt.Status.Traffic), stack.ConditionsLine(rt.Status.Conditions))
	}
	var revs servingv1alpha1.RevisionList
	if err := sc.s.Client.List(ctx, &revs, client.InNamespace(appNS), client.MatchingLabels{servingv1alpha1.ServiceLabelKey: rolloutSvc}); err != nil {
		fmt.Fprintf(&b, "; Revisions: %v", err)
	}
	for _, r := range revs.Items {
		fmt.Fprintf(&b, "; Revision %s: routing %q, actual %s desired %s, %s", r.Name, r.Status.RoutingState, int32s(r.Status.ActualReplicas), int32s(r.Status.DesiredReplicas), stack.ConditionsLine(r.Status.Conditions))
	}
	return b.String()
}

func int32s(p *int32) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprint(*p)
}

// waitFor calls check every 500 ms until it says done, for at most
// timeout; the error names what was waited for and what check last saw.
func waitFor(ctx context.Context, timeout time.Duration, what string, check func() (done bool, saw string)) error {
	deadline := time.Now().Add(timeout)
	for {
		done, saw := check()
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waited %s for %s; saw: %s", timeout, what, saw)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w; saw: %s", what, ctx.Err(), saw)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func sleepUntil(ctx context.Context, t time.Time) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(t)):
		return nil
	}
}

// routeWatch keeps each change of a Route's status.traffic and Ready, as
// its watch saw them.
type routeWatch struct {
	mu   sync.Mutex
	seen []routeSeen
}

type routeSeen struct {
	at      time.Time
	traffic []servingv1alpha1.TrafficTargetStatus
	ready   string
}

// watchRoute watches the Route name in appNS until ctx ends, watching
// again when the server ends a watch.
func watchRoute(ctx context.Context, wc client.WithWatch, name string) (*routeWatch, error) {
	rw := &routeWatch{}
	wt, err := wc.Watch(ctx, &servingv1alpha1.RouteList{}, client.InNamespace(appNS))
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			for ev := range wt.ResultChan() {
				if rt, ok := ev.Object.(*servingv1alpha1.Route); ok && rt.Name == name && ev.Type != watch.Deleted {
					rw.add(rt)
				}
			}
			wt.Stop()
			for {
				if ctx.Err() != nil {
					return
				}
				if wt, err = wc.Watch(ctx, &servingv1alpha1.RouteList{}, client.InNamespace(appNS)); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
	return rw, nil
}

func (rw *routeWatch) add(rt *servingv1alpha1.Route) {
	ready := "<none>"
	if c := meta.FindStatusCondition(rt.Status.Conditions, "Ready"); c != nil {
		ready = string(c.Status)
		if c.Status != metav1.ConditionTrue {
			ready += " " + c.Reason
		}
	}
	rw.mu.Lock()
	defer rw.mu.Unlock()
	if n := len(rw.seen); n > 0 && rw.seen[n-1].ready == ready && stack.TrafficLine(rw.seen[n-1].traffic) == stack.TrafficLine(rt.Status.Traffic) {
		return
	}
	rw.seen = append(rw.seen, routeSeen{at: time.Now(), traffic: rt.Status.Traffic, ready: ready})
}

// steps are the changes seen, from the first with any traffic, as the
// two revisions' percents from t0.
func (rw *routeWatch) steps(t0 time.Time, v1, v2 string) []splitStep {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	var out []splitStep
	for _, s := range rw.seen {
		if len(s.traffic) == 0 && len(out) == 0 {
			continue
		}
		out = append(out, splitStep{At: s.at.Sub(t0), V1: stack.PercentOf(s.traffic, v1), V2: stack.PercentOf(s.traffic, v2), Ready: s.ready})
	}
	return slices.Clip(out)
}
