package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/activatorprobe"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// TestE2ESocketRedirectSwitching: a target (min = max = 1 pod) is switched
// 100 times between Serve and Proxy, 50 each way (its PodAutoscaler's
// target-burst-capacity between 0 and -1), under steady load, and every
// node's redirect is timed beside kube-proxy's path in the same run.
//
// Every node of the cluster runs an in-node client in a pod of its own
// (the pod's netns and cgroup, as `kubectl exec` would put it, so that
// node's connect4 program, kept by that node's agent, sees its connects):
// a new-connection probe started every 5 ms and its share of the load. The
// test process, on no node, probes the same way: kube-proxy's path only.
//
// The load is c = 16 with keep-alive and c = 16 without, both at once and
// for the whole run, each split evenly over the nodes: one run of 100
// switches with both kinds of connection crossing every switch, rather
// than a run per kind, which would double the time for a lighter load.
// 32 requests of 20 ms in flight keep the 2-core box (and the whole
// cluster on it) CPU-bound: requests slow down but none should fail, as
// neither the pod (a Go server) nor the activators (no
// containerConcurrency: nothing queued, no 503 while the pod is ready)
// has a limit to overflow, and the clients wait 10 s. The load's latency
// is logged to show that headroom, and each failure its time from the
// nearest switch, so a failure here is the switch's, not the box's.
//
// Asserted: every request and probe succeeds, keep-alive or not; per
// node, once an in-node new connect went the new way, every one made
// after it until the next switch does: in Proxy, to an activator by the
// kernel's redirect (its socket's real destination is an activator while
// getpeername shows the Service), in Serve to the pod, not redirected; and
// each node's agent counted at least its node's redirected probes. Logged:
// per node, p50/p99 over the 50 switches each way of the time from the
// ServerlessService's status change to the first new connect redirected
// (to Proxy) and the first not redirected (to Serve), and the same for
// kube-proxy's path.
func TestE2ESocketRedirectSwitching(t *testing.T) {
	redirectSwitching(t, up(t), redirectRun{name: "flip", switches: 100, conc: 16, probeEvery: 5 * time.Millisecond})
}

// TestE2ESocketRedirectSwitchingIPv6: TestE2ESocketRedirectSwitching's
// scenario, lighter (20 switches, c = 4 of each kind, a probe every
// 10 ms), for a target whose public Service is IPv6 only: each node's
// connect6 program redirects new connects to the IPv6 cluster IP to an
// activator's IPv6 address in Proxy mode, and stops in Serve; getpeername
// shows the cluster IP; nothing fails.
func TestE2ESocketRedirectSwitchingIPv6(t *testing.T) {
	t.Parallel() // with the package's other parallel scenarios
	redirectSwitching(t, up(t), redirectRun{name: "flip6", switches: 20, conc: 4, probeEvery: 10 * time.Millisecond,
		families: []corev1.IPFamily{corev1.IPv6Protocol}})
}

// redirectRun sizes a run of redirectSwitching.
type redirectRun struct {
	name string
	// switches (half to Proxy, half to Serve), each load's clients over
	// all nodes (keep-alive, new-connection), and each client's probe
	// period.
	switches, conc int
	probeEvery     time.Duration
	// families of the target's public Service (the cluster's default if
	// none); one family.
	families []corev1.IPFamily
}

// redirectSwitching runs TestE2ESocketRedirectSwitching's scenario.
func redirectSwitching(t *testing.T, s *stack.Stack, run redirectRun) {
	ctx := context.Background()
	name, switches, conc, probeEvery := run.name, run.switches, run.conc, run.probeEvery
	app := stack.App{Namespace: appNS, Name: name, Spec: func(p *v1alpha1.PodAutoscalerSpec) {
		p.MinScale, p.MaxScale, p.TargetBurstCapacity = ptr.To(int32(1)), ptr.To(int32(1)), ptr.To(0.0)
	}}
	if run.families != nil {
		app.Service = func(svc *corev1.ServiceSpec) {
			svc.IPFamilies, svc.IPFamilyPolicy = run.families, ptr.To(corev1.IPFamilyPolicySingleStack)
		}
	}
	url := e2etest.DeployApp(t, s, app, func(url string) error {
		if a := get(oneShotClient(5*time.Second), url); a.err != nil || a.code != http.StatusOK {
			return fmt.Errorf("GET %s: %s; %s", url, a, publicPath(context.Background(), s, name))
		}
		return nil
	})
	removeAtEnd(t, s, name)
	svc := netip.MustParseAddrPort(strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/"))
	localRoute(t, svc.Addr())
	for _, a := range readyActivators(t, s, 2, time.Minute) {
		localRoute(t, a.IP)
	}
	if svc.Addr().Is6() {
		ips, err := activatorIPv6(ctx, s)
		if err != nil || len(ips) == 0 {
			t.Fatalf("the activators' IPv6 addresses: %v %v", ips, err)
		}
		for _, ip := range ips {
			localRoute(t, netip.MustParseAddr(ip))
		}
	}
	sks := watchMode(t, s, name)
	sks.wait(t, v1alpha1.ModeServe, time.Time{}, 30*time.Second)
	// Both nodes' agents run the redirect, and the ServerlessService says so
	// (kubectl get sks: SocketLayer True).
	e2etest.Eventually(t, 30*time.Second, "the SocketLayer condition True InEffect", func() error {
		var o v1alpha1.ServerlessService
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: name}, &o); err != nil {
			return err
		}
		c := meta.FindStatusCondition(o.Status.Conditions, "SocketLayer")
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != "InEffect" {
			return fmt.Errorf("SocketLayer is %+v", c)
		}
		return nil
	})

	var nodeList corev1.NodeList
	if err := s.Client.List(ctx, &nodeList); err != nil {
		t.Fatal(err)
	}
	if len(nodeList.Items) < 2 {
		t.Fatalf("%d nodes, want at least 2 to measure redirects per node", len(nodeList.Items))
	}
	redirected := map[string]string{"namespace": appNS, "serverlessservice": name}
	var nodes []*nodeClient
	for i, n := range nodeList.Items {
		nc := &nodeClient{name: n.Name, agent: agentAddr(t, s, n.Name)}
		nc.before = scrapeSum(t, s, nc.agent, "sockscale_agent_redirect_connects_total", redirected)
		nc.setsBefore, nc.deletesBefore = mapWrites(t, s, nc.agent)
		nc.in = startInNodeClientAs(t, s, name+"-client", n.Name, innodeConfig{
			Addr: svc, KeepAlive: share(conc, i, len(nodeList.Items)), NewConn: share(conc, i, len(nodeList.Items)),
			Recycle: 20, Query: "?sleep=20", ProbeEvery: probeEvery,
		})
		nodes = append(nodes, nc)
	}
	out := startOutsideProbes(svc, probeEvery)
	defer out.stop()
	// Who probes: each node's in-node client (kernel: its redirect is
	// what is measured), then the outside one.
	type prober struct {
		who    string
		kernel bool
		p      *probes
	}
	var probers []prober
	for _, n := range nodes {
		probers = append(probers, prober{n.name, true, &n.in.probes})
	}
	probers = append(probers, prober{"outside", false, &out.probes})
	waitFor(t, 30*time.Second, "every client's probes answered by the pod", func() error {
		for _, c := range probers {
			if ps := c.p.since(time.Time{}); len(ps) < 5 || ps[len(ps)-1].Landed != landedPod {
				return fmt.Errorf("%s: %d probes, the last %+v", c.who, len(ps), last(ps))
			}
		}
		return nil
	})

	start := time.Now()
	var sw switchLog
	for i := range switches {
		to, tbc := v1alpha1.ModeProxy, -1.0
		if i%2 == 1 {
			to, tbc = v1alpha1.ModeServe, 0.0
		}
		pa, err := s.PA(ctx, appNS, name)
		if err != nil {
			t.Fatal(err)
		}
		patch := client.MergeFrom(pa.DeepCopy())
		pa.Spec.TargetBurstCapacity = ptr.To(tbc)
		patched := time.Now()
		if err := s.Client.Patch(ctx, pa, patch); err != nil {
			t.Fatal(err)
		}
		seen := sks.wait(t, to, patched, 30*time.Second)
		sw = append(sw, switchAt{to: to, patched: patched, seen: seen})
		// Every client's new connects go the new way before the next switch.
		waitFor(t, 30*time.Second, fmt.Sprintf("switch %d to %s: every client follows", i+1, to), func() error {
			for _, c := range probers {
				if ps := c.p.since(patched); firstNew(ps, to, c.kernel) == nil {
					return fmt.Errorf("%s: no new connect the new way in %d probes since the patch (the last %+v)", c.who, len(ps), last(ps))
				}
			}
			return nil
		})
		time.Sleep(500 * time.Millisecond) // load in the settled mode
	}
	took := time.Since(start)
	for _, n := range nodes {
		n.loads = n.in.stop(t)
		n.after = scrapeSum(t, s, n.agent, "sockscale_agent_redirect_connects_total", redirected)
		n.setsAfter, n.deletesAfter = mapWrites(t, s, n.agent)
		n.probes = n.in.probes.since(time.Time{})
	}
	out.stop()
	outProbes := out.since(time.Time{})

	// Per switch, per node: the settled checks and the times from the
	// status change.
	var outToProxy, outToServe []time.Duration
	for i, w := range sw {
		end := time.Now()
		if i+1 < len(sw) {
			end = sw[i+1].patched
		}
		line := fmt.Sprintf("switch %3d to %s: status seen %s after the patch; from the status,", i+1, w.to, w.seen.Sub(w.patched).Round(time.Millisecond))
		if ch := sks.between(w.patched, end); len(ch) != 1 {
			line = fmt.Sprintf("switch %3d to %s: the status changed %d times before the next patch: %s;", i+1, w.to, len(ch), ch)
		}
		for _, n := range nodes {
			inW := window(n.probes, w.patched, end)
			checkSettled(t, n.name, i+1, w.to, svc, inW, end)
			first := firstNew(inW, w.to, true)
			if first == nil {
				t.Errorf("switch %d to %s: %s's in-node client made no new connect the new way", i+1, w.to, n.name)
				continue
			}
			if w.to == v1alpha1.ModeProxy {
				n.toProxy = append(n.toProxy, first.At.Sub(w.seen))
				line += fmt.Sprintf(" %s redirected %s;", n.name, switched(inW, w.to, true, w.seen))
				continue
			}
			gone := firstUnredirected(inW).At.Sub(w.seen)
			n.redirectGone, n.toPod = append(n.redirectGone, gone), append(n.toPod, first.At.Sub(w.seen))
			line += fmt.Sprintf(" %s redirect gone %+.1f ms, to the pod %s;", n.name, ms(gone), switched(inW, w.to, true, w.seen))
		}
		outW := window(outProbes, w.patched, end)
		first := firstNew(outW, w.to, false)
		if first == nil {
			t.Errorf("switch %d to %s: the outside client made no new connect the new way", i+1, w.to)
			continue
		}
		if w.to == v1alpha1.ModeProxy {
			outToProxy = append(outToProxy, first.At.Sub(w.seen))
		} else {
			outToServe = append(outToServe, first.At.Sub(w.seen))
		}
		t.Logf("%s outside (kube-proxy) to the %s %s", line, map[v1alpha1.Mode]string{v1alpha1.ModeProxy: "activators", v1alpha1.ModeServe: "pod"}[w.to], switched(outW, w.to, false, w.seen))
	}
	t.Logf("%d switches in %s; each client started a new-connection probe at most every %s (up to %d at once); times are from the ServerlessService's status change as this test's watch saw it to the probe's connect() (negative when a client switched first), the last probe the old way in brackets; p99 of 50 is the max",
		switches, took.Round(100*time.Millisecond), probeEvery, probesInFlight)
	for _, n := range nodes {
		t.Logf("%s, its agent's redirect (in-node probe every %s on average, %s at most): to Proxy, first new connect redirected to an activator p50 %+.1f ms p99 %+.1f ms (n=%d); to Serve, redirect gone p50 %+.1f ms p99 %+.1f ms, first new connect to the pod (kube-proxy) p50 %+.1f ms p99 %+.1f ms (n=%d)",
			n.name, meanGap(n.probes).Round(100*time.Microsecond), maxGap(n.probes).Round(100*time.Microsecond), ms(pct(n.toProxy, 0.5)), ms(pct(n.toProxy, 0.99)), len(n.toProxy),
			ms(pct(n.redirectGone, 0.5)), ms(pct(n.redirectGone, 0.99)), ms(pct(n.toPod, 0.5)), ms(pct(n.toPod, 0.99)), len(n.toPod))
	}
	t.Logf("kube-proxy's path, EndpointSlice -> iptables (outside probe every %s on average, %s at most): to Proxy, first new connect to an activator p50 %+.1f ms p99 %+.1f ms (n=%d); to Serve, first new connect to the pod p50 %+.1f ms p99 %+.1f ms (n=%d)",
		meanGap(outProbes).Round(100*time.Microsecond), maxGap(outProbes).Round(100*time.Microsecond), ms(pct(outToProxy, 0.5)), ms(pct(outToProxy, 0.99)), len(outToProxy), ms(pct(outToServe, 0.5)), ms(pct(outToServe, 0.99)), len(outToServe))

	// Nothing failed: the loads, per kind over every node, and the probes.
	for k, kind := range []string{"keep-alive", "new-connection"} {
		var sum loadResult
		var per []string
		for _, n := range nodes {
			if k >= len(n.loads) {
				continue // stop reported it
			}
			l := n.loads[k]
			sum.Completed, sum.Failed, sum.Conns = sum.Completed+l.Completed, sum.Failed+l.Failed, sum.Conns+l.Conns
			per = append(per, fmt.Sprintf("%s c=%d %d requests on %d connections, %d failed, latency p50 %s p99 %s max %s",
				n.name, l.Clients, l.Completed, l.Conns, l.Failed, l.P50.Round(100*time.Microsecond), l.P99.Round(100*time.Microsecond), l.Max.Round(time.Millisecond)))
			for _, f := range l.Failures {
				t.Errorf("%s %s load: a request failed %s: %s", n.name, kind, sw.when(f.At), f.Err)
			}
		}
		t.Logf("%s load, c = %d: %d requests on %d connections, %d failed (%s)", kind, conc, sum.Completed, sum.Conns, sum.Failed, strings.Join(per, "; "))
		if sum.Failed > 0 || sum.Completed == 0 {
			t.Errorf("%s load: %d of %d requests failed", kind, sum.Failed, sum.Completed+sum.Failed)
		}
	}
	probeSets := []struct {
		who    string
		probes []probeResult
	}{{"outside", outProbes}}
	for _, n := range nodes {
		probeSets = append(probeSets, struct {
			who    string
			probes []probeResult
		}{n.name + " in-node", n.probes})
	}
	for _, c := range probeSets {
		var failed []string
		for _, p := range c.probes {
			if p.Err != "" {
				failed = append(failed, sw.when(p.At)+": "+p.Err)
			}
		}
		t.Logf("%s probes: %d new connections, %d failed", c.who, len(c.probes), len(failed))
		if len(failed) > 0 {
			t.Errorf("%s probes: %d of %d failed, e.g. %q", c.who, len(failed), len(c.probes), failed[:min(5, len(failed))])
		}
	}
	// Each node's kernel path was exercised, and that node's agent counted it.
	for _, n := range nodes {
		var kernel int
		for _, p := range n.probes {
			if p.Kernel {
				kernel++
			}
		}
		t.Logf("%s: %d of its in-node client's probes were redirected by the kernel; its agent counted %v redirected connects for %s/%s and wrote its map %v times (set) and %v (delete)", n.name, kernel, n.after-n.before, appNS, name, n.setsAfter-n.setsBefore, n.deletesAfter-n.deletesBefore)
		if kernel == 0 || n.after-n.before < float64(kernel) {
			t.Errorf("sockscale_agent_redirect_connects_total on %s grew by %v, want at least the %d probes the kernel redirected there", n.name, n.after-n.before, kernel)
		}
	}
}

// nodeClient is a node's in-node client and what it measured.
type nodeClient struct {
	name          string
	agent         netip.Addr
	in            *inNodeClient
	before, after float64 // its agent's redirected connects
	// Its agent's writes to the kernel map, every target's.
	setsBefore, setsAfter, deletesBefore, deletesAfter float64
	probes                                             []probeResult
	loads                                              []loadResult
	// From the status change: to Proxy, the first new connect redirected;
	// to Serve, the first not redirected, and the first to the pod.
	toProxy, redirectGone, toPod []time.Duration
}

// share is client i's part of n clients' total.
func share(total, i, n int) int {
	if i < total%n {
		return total/n + 1
	}
	return total / n
}

// switchAt is one switch: the patch of the PodAutoscaler and when this
// test saw the ServerlessService's status follow.
type switchAt struct {
	to            v1alpha1.Mode
	patched, seen time.Time
}

// switchLog is the run's switches in order.
type switchLog []switchAt

// when places at in the run: from the status change of the last switch
// patched before it, e.g. "at switch 17 (to Proxy) +12.3 ms".
func (l switchLog) when(at time.Time) string {
	i := slices.IndexFunc(l, func(w switchAt) bool { return w.patched.After(at) }) - 1
	if i == -2 {
		i = len(l) - 1
	}
	if i < 0 {
		return "before the first switch, at " + at.Format("15:04:05.000")
	}
	return fmt.Sprintf("at switch %d (to %s) %+.1f ms", i+1, l[i].to, ms(at.Sub(l[i].seen)))
}

// Where a probe landed: the activator answers a probe itself
// (activatorprobe), a pod answers it as any request.
const (
	landedActivator = "activator"
	landedPod       = "pod"
)

// probeResult is one probe: a new connection to the Service and a
// request only an activator answers in kind.
type probeResult struct {
	At time.Time // connect() about to be called
	// Connected: the connection is up. The kernel chose its destination
	// (connect4 ran) between At and Connected.
	Connected time.Time `json:",omitzero"`
	Landed    string    `json:",omitempty"` // landedActivator or landedPod; "" if it failed
	// Kernel (in-node only): the socket's real destination (Dest, from
	// /proc/self/net/tcp, read when an activator answered) is not the
	// address dialled: connect4 rewrote it.
	Kernel bool           `json:",omitempty"`
	Dest   netip.AddrPort `json:",omitzero"`
	// Peer is what getpeername says (in-node only): the address dialled,
	// whatever the destination.
	Peer netip.AddrPort `json:",omitzero"`
	Err  string         `json:",omitempty"`
}

// firstNew is the first probe that went the way of mode to: an activator
// (by the kernel's redirect if kernel) or a pod (not redirected).
func firstNew(probes []probeResult, to v1alpha1.Mode, kernel bool) *probeResult {
	if i := firstNewIndex(probes, to, kernel); i >= 0 {
		return &probes[i]
	}
	return nil
}

func firstNewIndex(probes []probeResult, to v1alpha1.Mode, kernel bool) int {
	return slices.IndexFunc(probes, func(p probeResult) bool { return wentTo(p, to, kernel) })
}

// switched says when a client's connects went the new way, from the
// status change seen: at the first probe that did, after the last one
// that did not (the switch took effect in between), e.g. "+6.3 ms (+1.2)".
func switched(probes []probeResult, to v1alpha1.Mode, kernel bool, seen time.Time) string {
	i := firstNewIndex(probes, to, kernel)
	if i < 0 {
		return "never"
	}
	if i == 0 {
		return fmt.Sprintf("%+.1f ms (the first probe)", ms(probes[i].At.Sub(seen)))
	}
	return fmt.Sprintf("%+.1f ms (%+.1f)", ms(probes[i].At.Sub(seen)), ms(probes[i-1].At.Sub(seen)))
}

func wentTo(p probeResult, to v1alpha1.Mode, kernel bool) bool {
	if to == v1alpha1.ModeProxy {
		return p.Landed == landedActivator && (p.Kernel || !kernel)
	}
	return p.Landed == landedPod && !p.Kernel
}

func firstUnredirected(probes []probeResult) probeResult {
	for _, p := range probes {
		if !p.Kernel && p.Err == "" {
			return p
		}
	}
	return probeResult{}
}

// checkSettled: once a connect of node's in-node client went the new way,
// every connect made after it returned and before the next switch's patch
// (next) does: in Proxy each is redirected to an activator by the kernel, in
// Serve none is and each reaches the pod; and getpeername always shows the
// Service's address. The kernel decides somewhere between a probe's At and
// its Connected, which on a loaded machine can be hundreds of ms apart: a
// probe that overlaps the first one or the next patch may rightly have
// gone either way.
func checkSettled(t *testing.T, node string, n int, to v1alpha1.Mode, svc netip.AddrPort, probes []probeResult, next time.Time) {
	t.Helper()
	var settled time.Time
	var first probeResult
	if i := firstNewIndex(probes, to, true); i >= 0 {
		first = probes[i]
		settled = first.Connected
	}
	bad := 0
	for _, p := range probes {
		if p.Err != "" {
			continue // counted with the failures
		}
		if p.Peer != svc {
			t.Errorf("switch %d, %s: getpeername said %s for a connect to %s (redirected to %s: %v)", n, node, p.Peer, svc, p.Dest, p.Kernel)
		}
		if p.Kernel && p.Dest.Port() != stack.ActivatorProxyPort {
			t.Errorf("switch %d, %s: a connect redirected to %s, not to an activator's port %d", n, node, p.Dest, stack.ActivatorProxyPort)
		}
		if !settled.IsZero() && p.At.After(settled) && p.Connected.Before(next) && !wentTo(p, to, true) {
			if bad++; bad <= 3 {
				t.Errorf("switch %d to %s, %s: after the in-node client's connects went the new way (the first connected %s, to %s), one made %s after it, from %s to %s, went to %s (%s, redirected %v)",
					n, to, node, first.Connected.Format("15:04:05.000"), first.Dest, p.At.Sub(settled).Round(100*time.Microsecond),
					p.At.Format("15:04:05.000"), p.Connected.Format("15:04:05.000"), p.Landed, p.Dest, p.Kernel)
			}
		}
	}
}

func window(probes []probeResult, from, to time.Time) []probeResult {
	var out []probeResult
	for _, p := range probes {
		if !p.At.Before(from) && p.At.Before(to) {
			out = append(out, p)
		}
	}
	return out
}

func last(probes []probeResult) *probeResult {
	if len(probes) == 0 {
		return nil
	}
	return &probes[len(probes)-1]
}

// probe opens a new connection to svc and sends an activator probe on it.
// inNode also reads the socket's real destination. It waits as long as the
// load's requests (loadTimeout): on a CPU-bound machine a lost SYN's
// retransmits (after 1 s, 3 s) are slowness, not a failed switch.
func probe(svc netip.AddrPort, inNode bool) probeResult {
	r := probeResult{At: time.Now()}
	// At is taken again just before connect(): on a loaded machine the
	// goroutine may wait long enough between here and there to connect
	// after the next switch.
	d := net.Dialer{Timeout: loadTimeout, Control: func(string, string, syscall.RawConn) error {
		r.At = time.Now()
		return nil
	}}
	conn, err := d.Dial("tcp", svc.String())
	if err != nil {
		r.Err = err.Error()
		return r
	}
	r.Connected = time.Now()
	defer conn.Close()
	if inNode {
		peer := conn.RemoteAddr().(*net.TCPAddr).AddrPort()
		r.Peer = netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port())
	}
	_ = conn.SetDeadline(r.At.Add(loadTimeout))
	req := "GET / HTTP/1.1\r\nHost: " + svc.String() + "\r\n" + activatorprobe.Header + ": " + activatorprobe.Value +
		"\r\nUser-Agent: " + activatorprobe.UserAgent + "\r\nConnection: close\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		r.Err = err.Error()
		return r
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: http.MethodGet})
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		r.Err = err.Error()
		return r
	}
	if resp.StatusCode != http.StatusOK {
		r.Err = resp.Status
		return r
	}
	r.Landed = landedPod
	if resp.Header.Get(activatorprobe.ResponseHeader) == "" {
		return r // a pod: kube-proxy's path, the kernel redirects to activators only
	}
	r.Landed = landedActivator
	if inNode {
		// Still listed (the socket is open): by the kernel or by kube-proxy?
		if r.Dest, err = stack.SocketDest(conn.(*net.TCPConn)); err != nil {
			r.Err = err.Error()
			return r
		}
		r.Kernel = r.Dest != svc
	}
	return r
}

// probes is a growing list of probe results, read while it grows.
type probes struct {
	mu   sync.Mutex
	list []probeResult
}

// add inserts r in the order of the probes' starts: probes run
// concurrently (probeLoop) and may end out of order.
func (p *probes) add(r probeResult) {
	p.mu.Lock()
	i, _ := slices.BinarySearchFunc(p.list, r.At, func(r probeResult, t time.Time) int { return r.At.Compare(t) })
	p.list = slices.Insert(p.list, i, r)
	p.mu.Unlock()
}

// since returns the probes made at or after t.
func (p *probes) since(t time.Time) []probeResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	i, _ := slices.BinarySearchFunc(p.list, t, func(r probeResult, t time.Time) int { return r.At.Compare(t) })
	return slices.Clone(p.list[i:])
}

// outsideProbes probes from the test process: on no node, so only
// kube-proxy switches its connects.
type outsideProbes struct {
	probes
	cancel context.CancelFunc
	done   chan struct{}
}

func startOutsideProbes(svc netip.AddrPort, every time.Duration) *outsideProbes {
	ctx, cancel := context.WithCancel(context.Background())
	o := &outsideProbes{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(o.done)
		probeLoop(ctx, every, func() { o.add(probe(svc, false)) })
	}()
	return o
}

func (o *outsideProbes) stop() {
	o.cancel()
	<-o.done
}

// probeLoop starts probe every period, each in a goroutine of its own (at
// most probesInFlight at once), until ctx ends, and waits for those
// started. A probe takes a few ms, more on a loaded machine: run one after
// another they would be that far apart and say only that coarsely when a
// switch took effect.
func probeLoop(ctx context.Context, every time.Duration, probe func()) {
	sem := make(chan struct{}, probesInFlight)
	var wg sync.WaitGroup
	paced(ctx, every, func() {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			probe()
		})
	})
	wg.Wait()
}

const probesInFlight = 16

// loadTimeout bounds each request of the loads and each probe.
const loadTimeout = 10 * time.Second

// paced calls f every period (at once if it took longer) until ctx ends.
func paced(ctx context.Context, every time.Duration, f func()) {
	next := time.Now()
	for ctx.Err() == nil {
		f()
		next = next.Add(every)
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		} else {
			next = time.Now()
		}
	}
}

// The in-node client is this test binary run again (TestHelperInNodeClient)
// through `ip netns exec` in a pod's netns and cloned into the pod's cgroup.
// It writes a line per probe, then its loads' results, to stdout, and
// stops when its stdin closes.
const (
	innodeEnv     = "SOCKSCALE_E2E_INNODE_CLIENT"
	innodeProbe   = "innode-probe "
	innodeLoad    = "innode-load "
	innodeRunning = "innode-running"
)

type innodeConfig struct {
	Addr netip.AddrPort
	// KeepAlive and NewConn are the clients of the two loads; each
	// keep-alive client closes its connection every Recycle requests, so
	// connections made in one mode live on into the next.
	KeepAlive, NewConn, Recycle int
	// Query is the load's request ("?sleep=20": 20 ms at the pod).
	Query      string
	ProbeEvery time.Duration
}

// loadResult is one of the in-node client's loads.
type loadResult struct {
	Kind                     string
	Clients                  int
	Completed, Failed, Conns int64
	// P50, P99 and Max are the requests' latencies, failed ones included.
	P50, P99, Max time.Duration
	Failures      []loadFailure // the first few of each client
	// MaxInFlight is the most requests a pod said it had in flight (the
	// test app's X-In-Flight) in any answer of this load.
	MaxInFlight int64
}

type loadFailure struct {
	At  time.Time
	Err string
}

// TestHelperInNodeClient is not a test: it is the in-node client's process
// (see startInNodeClientAs) and returns at once unless it is that.
func TestHelperInNodeClient(t *testing.T) {
	cfgJSON := os.Getenv(innodeEnv)
	if cfgJSON == "" {
		return
	}
	var cfg innodeConfig
	if err := json.Unmarshal([]byte(cfgJSON), &cfg); err != nil {
		t.Fatalf("$%s: %v", innodeEnv, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	var outMu sync.Mutex
	emit := func(prefix string, v any) {
		b, _ := json.Marshal(v)
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Printf("%s%s\n", prefix, b)
	}
	url := "http://" + cfg.Addr.String() + "/" + cfg.Query
	loads := []*loadResult{{Kind: "keep-alive", Clients: cfg.KeepAlive}, {Kind: "new-connection", Clients: cfg.NewConn}}
	latencies := make([][]time.Duration, len(loads))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for kind, n := range []int{cfg.KeepAlive, cfg.NewConn} {
		res := loads[kind]
		for range n {
			wg.Go(func() {
				tr := &http.Transport{DisableKeepAlives: kind == 1, MaxIdleConnsPerHost: 1, Proxy: nil}
				defer tr.CloseIdleConnections()
				c := &http.Client{Transport: tr, Timeout: loadTimeout}
				var conns atomic.Int64
				trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
					if !i.Reused {
						conns.Add(1)
					}
				}}
				var mine loadResult
				var took []time.Duration
				var most int64
				// Requests are not cancelled at the end: one in flight
				// finishes and counts.
				for i := 1; ctx.Err() == nil; i++ {
					req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), http.MethodGet, url, nil)
					at := time.Now()
					inFlight, err := getOK(c, req)
					most = max(most, inFlight)
					took = append(took, time.Since(at))
					if err != nil {
						mine.Failed++
						if len(mine.Failures) < 3 {
							mine.Failures = append(mine.Failures, loadFailure{At: at, Err: err.Error()})
						}
					} else {
						mine.Completed++
					}
					if kind == 0 && i%cfg.Recycle == 0 {
						tr.CloseIdleConnections()
					}
				}
				mu.Lock()
				res.Completed += mine.Completed
				res.Failed += mine.Failed
				res.Conns += conns.Load()
				res.MaxInFlight = max(res.MaxInFlight, most)
				res.Failures = append(res.Failures, mine.Failures...)
				latencies[kind] = append(latencies[kind], took...)
				mu.Unlock()
			})
		}
	}
	wg.Go(func() { probeLoop(ctx, cfg.ProbeEvery, func() { emit(innodeProbe, probe(cfg.Addr, true)) }) })
	fmt.Println(innodeRunning)
	wg.Wait()
	for kind, l := range loads {
		l.P50, l.P99, l.Max = pct(latencies[kind], 0.5), pct(latencies[kind], 0.99), slices.Max(append(latencies[kind], 0))
		emit(innodeLoad, l)
	}
}

// getOK sends req and returns the requests the answering pod had in
// flight (the test app's X-In-Flight; 0 if absent): an error unless a
// pod answered 200.
func getOK(c *http.Client, req *http.Request) (int64, error) {
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(body), "pod ") {
		return 0, fmt.Errorf("%s: %q", resp.Status, strings.TrimSpace(string(body)))
	}
	inFlight, _ := strconv.ParseInt(resp.Header.Get("X-In-Flight"), 10, 64)
	return inFlight, nil
}

// inNodeClient is the running in-node client.
type inNodeClient struct {
	probes probes
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	loads  []loadResult
	// read is closed when its stdout is read to the end.
	read   chan struct{}
	stderr strings.Builder
	once   sync.Once
}

// startInNodeClientAs runs the in-node client in a pod of its own on
// node, named <prefix>-<node>: its network namespace and its cgroup
// (below the node's, where the node's agent attached its programs), as
// `kubectl exec` would.
func startInNodeClientAs(t *testing.T, s *stack.Stack, prefix, node string, cfg innodeConfig) *inNodeClient {
	t.Helper()
	box := newClientSandbox(t, s, prefix, node)
	c := &inNodeClient{read: make(chan struct{})}
	var cg *os.File
	c.cmd, cg = box.helper(t, "TestHelperInNodeClient", innodeEnv, cfg)
	defer cg.Close()
	c.cmd.Stderr = &c.stderr
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.stop(t) })
	running := make(chan struct{})
	go func() {
		defer close(c.read)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == innodeRunning:
				close(running)
			case strings.HasPrefix(line, innodeProbe):
				var r probeResult
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, innodeProbe)), &r); err == nil {
					c.probes.add(r)
				}
			case strings.HasPrefix(line, innodeLoad):
				var l loadResult
				if err := json.Unmarshal([]byte(strings.TrimPrefix(line, innodeLoad)), &l); err == nil {
					c.loads = append(c.loads, l)
				}
			}
		}
	}()
	select {
	case <-running:
	case <-c.read:
		t.Fatalf("the in-node client ended before it ran: %v\n%s", c.cmd.Wait(), c.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("the in-node client did not start within 30 s")
	}
	t.Logf("in-node client: pid %d in pod %s on %s (netns %s, cgroup %s)", c.cmd.Process.Pid, box.pod, node, box.netns, box.cgroup)
	return c
}

// stop ends the client (its requests in flight finish) and returns its
// loads' results.
func (c *inNodeClient) stop(t *testing.T) []loadResult {
	t.Helper()
	c.once.Do(func() {
		_ = c.stdin.Close()
		select {
		case <-c.read:
		case <-time.After(30 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.read
			t.Error("the in-node client did not stop within 30 s: killed")
		}
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("the in-node client: %v\n%s", err, c.stderr.String())
		}
		if len(c.loads) != 2 {
			t.Errorf("the in-node client reported %d loads, want 2", len(c.loads))
		}
	})
	return c.loads
}

// modeWatch follows a ServerlessService's status: when this test saw each
// change of its mode (counted only with a True Ready condition).
type modeWatch struct {
	mu   sync.Mutex
	seen []modeSeen
}

type modeSeen struct {
	at   time.Time
	mode v1alpha1.Mode
}

func watchMode(t *testing.T, s *stack.Stack, name string) *modeWatch {
	t.Helper()
	wc, err := client.NewWithWatch(shared.Config, client.Options{Scheme: s.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &modeWatch{}
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	var wt watch.Interface
	if wt, err = wc.Watch(ctx, &v1alpha1.ServerlessServiceList{}, client.InNamespace(appNS)); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			for ev := range wt.ResultChan() {
				sks, ok := ev.Object.(*v1alpha1.ServerlessService)
				if !ok || sks.Name != name {
					continue
				}
				mode := sks.Status.Mode
				if !meta.IsStatusConditionTrue(sks.Status.Conditions, "Ready") {
					mode = ""
				}
				w.mu.Lock()
				if len(w.seen) == 0 || w.seen[len(w.seen)-1].mode != mode {
					w.seen = append(w.seen, modeSeen{at: time.Now(), mode: mode})
				}
				w.mu.Unlock()
			}
			wt.Stop()
			// The server ended the watch: start again (a change in
			// between is seen with the next event's state).
			for ctx.Err() == nil {
				if wt, err = wc.Watch(ctx, &v1alpha1.ServerlessServiceList{}, client.InNamespace(appNS)); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		if wt != nil {
			wt.Stop()
		}
	}()
	return w
}

// between returns the changes seen in [from, to).
func (w *modeWatch) between(from, to time.Time) []modeSeen {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []modeSeen
	for _, s := range w.seen {
		if !s.at.Before(from) && s.at.Before(to) {
			out = append(out, s)
		}
	}
	return out
}

func (s modeSeen) String() string {
	mode := string(s.mode)
	if mode == "" {
		mode = "not ready"
	}
	return s.at.Format("15:04:05.000") + " " + mode
}

// wait returns when the status changed to mode at or after from.
func (w *modeWatch) wait(t *testing.T, mode v1alpha1.Mode, from time.Time, timeout time.Duration) time.Time {
	t.Helper()
	var at time.Time
	waitFor(t, timeout, "the ServerlessService's status says "+string(mode), func() error {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, s := range w.seen {
			if s.mode == mode && !s.at.Before(from) {
				at = s.at
				return nil
			}
		}
		if from.IsZero() && len(w.seen) > 0 && w.seen[len(w.seen)-1].mode == mode {
			at = w.seen[len(w.seen)-1].at
			return nil
		}
		return fmt.Errorf("seen %v", w.seen)
	})
	return at
}

// waitFor is e2etest.Eventually with a 20 ms step, for waits measured in
// milliseconds.
func waitFor(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	e2etest.Poll(t, timeout, 20*time.Millisecond, what, f)
}

// agentAddr is the address of node's ready agent pod.
func agentAddr(t *testing.T, s *stack.Stack, node string) netip.Addr {
	t.Helper()
	var addr netip.Addr
	e2etest.Eventually(t, time.Minute, "a ready agent on "+node, func() error {
		var pods corev1.PodList
		if err := s.Client.List(context.Background(), &pods, client.InNamespace(stack.Namespace), stack.AgentPods); err != nil {
			return err
		}
		for _, p := range pods.Items {
			ip, err := netip.ParseAddr(p.Status.PodIP)
			if p.Spec.NodeName != node || p.DeletionTimestamp != nil || err != nil {
				continue
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					addr = ip
					return nil
				}
			}
		}
		return fmt.Errorf("none of %d agent pods", len(pods.Items))
	})
	localRoute(t, addr)
	return addr
}

func scrapeSum(t *testing.T, s *stack.Stack, ip netip.Addr, metric string, match map[string]string) float64 {
	t.Helper()
	m, err := s.Scrape(context.Background(), ip, stack.AgentMetricsPort)
	if err != nil {
		t.Fatal(err)
	}
	return stack.Sum(m, metric, match)
}

// mapWrites are the kernel map writes (set, delete) of the agent at ip.
func mapWrites(t *testing.T, s *stack.Stack, ip netip.Addr) (sets, deletes float64) {
	t.Helper()
	m, err := s.Scrape(context.Background(), ip, stack.AgentMetricsPort)
	if err != nil {
		t.Fatal(err)
	}
	return stack.Sum(m, "sockscale_agent_redirect_updates_total", map[string]string{"op": "set"}),
		stack.Sum(m, "sockscale_agent_redirect_updates_total", map[string]string{"op": "delete"})
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// meanGap is the mean time between the starts of consecutive probes.
func meanGap(p []probeResult) time.Duration {
	if len(p) < 2 {
		return 0
	}
	return p[len(p)-1].At.Sub(p[0].At) / time.Duration(len(p)-1)
}

// maxGap is the longest time between the starts of consecutive probes.
func maxGap(p []probeResult) time.Duration {
	var gap time.Duration
	for i := 1; i < len(p); i++ {
		gap = max(gap, p[i].At.Sub(p[i-1].At))
	}
	return gap
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
