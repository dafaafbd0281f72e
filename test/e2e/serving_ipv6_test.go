package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// TestE2EServingSplitIPv6: on the dual-stack cluster a serving Service's
// Route and Revisions are reachable over both families (their Services
// prefer dual-stack), and a 70/30 split between v1 and v2 holds over
// IPv6:
//
//   - from a pod on each node, 100 new connections to the Route's IPv6
//     address: each node's connect6 program rewrites every one to the
//     IPv6 cluster IP of one of the Revisions' public Services, the pod
//     that answers (200) is of that Revision, and v2 has 30 % of them
//     within splitTolerance;
//   - from the test process on no node, 100 connections to the same
//     address go through kube-proxy to the activators' route port, which
//     split per request: all answered 200 by a pod of v1 or v2, v2's share
//     within the same tolerance.
func TestE2EServingSplitIPv6(t *testing.T) {
	t.Parallel() // with the package's other parallel scenarios
	s := up(t)
	ctx := context.Background()
	const (
		name  = "split6"
		conns = 100
		v2Pct = 30
		// splitTolerance: v2's share of 100 connections at p = 0.3 has a
		// standard deviation of 4.6 points; 15 is 3.3 of them.
		splitTolerance = 15
	)
	v1Name, v2Name := name+"-00001", name+"-00002"
	createServing(t, s, servingService(name, "v1", map[string]string{
		"autoscaling.knative.dev/min-scale":             "1",
		"autoscaling.knative.dev/max-scale":             "1",
		"autoscaling.knative.dev/target-burst-capacity": "0",
	}))
	waitLatestReady(t, s, name, v1Name, 3*time.Minute)
	updateService(t, s, name, func(cur *servingv1alpha1.Service) { cur.Spec.Template.Spec.Containers[0].Env[0].Value = "v2" })
	waitLatestReady(t, s, name, v2Name, 3*time.Minute)
	updateService(t, s, name, func(cur *servingv1alpha1.Service) {
		cur.Spec.Traffic = []servingv1alpha1.TrafficTarget{
			{RevisionName: v1Name, Percent: ptr.To(int64(100 - v2Pct))},
			{RevisionName: v2Name, Percent: ptr.To(int64(v2Pct))},
		}
	})
	waitRouteTraffic(t, s, name, fmt.Sprintf("%s %d%%, %s %d%%", v1Name, 100-v2Pct, v2Name, v2Pct), time.Minute)
	route := ipv6AddressOf(t, s, name)
	byAddr := map[netip.AddrPort]string{ipv6AddressOf(t, s, v1Name): v1Name, ipv6AddressOf(t, s, v2Name): v2Name}

	share := func(who string, rs []connResult, inNode bool) {
		t.Helper()
		v2 := 0
		for _, r := range rs {
			rev := r.revision()
			if r.Err != "" || (rev != v1Name && rev != v2Name) {
				t.Errorf("%s: a connection to %s: %s, want 200 from a pod of %s or %s; %s", who, route, connLine(r), v1Name, v2Name, servingDiag(ctx, s, name))
				continue
			}
			if rev == v2Name {
				v2++
			}
			if !inNode {
				continue
			}
			if want, ok := byAddr[r.Dest]; !ok || want != rev {
				t.Errorf("%s: a connection to %s went to %s (%q's public Service) and was answered by %s: want the kernel's rewrite to the IPv6 address of the Revision that answers (%v)", who, route, r.Dest, want, r.Pod, byAddr)
			}
		}
		t.Logf("%s: %d connections to %s, %d answered by %s (%d %%, want %d +- %d)", who, len(rs), route, v2, v2Name, 100*v2/max(1, len(rs)), v2Pct, splitTolerance)
		if got := 100 * v2 / max(1, len(rs)); got < v2Pct-splitTolerance || got > v2Pct+splitTolerance {
			t.Errorf("%s: %s had %d %% of the connections, want %d +- %d", who, v2Name, got, v2Pct, splitTolerance)
		}
	}

	var nodes corev1.NodeList
	if err := s.Client.List(ctx, &nodes); err != nil || len(nodes.Items) < 2 {
		t.Fatalf("nodes: %d, %v; want at least 2: the split is each node's agent's", len(nodes.Items), err)
	}
	for _, n := range nodes.Items {
		box := newClientSandbox(t, s, name+"-client", n.Name)
		// The node's agent has the split once a connect is rewritten.
		e2etest.Eventually(t, 30*time.Second, n.Name+"'s kernel splits "+route.String(), func() error {
			r := box.once(t, loadTimeout, route)[0]
			if _, ok := byAddr[r.Dest]; !ok || r.Err != "" {
				return fmt.Errorf("a connection to %s went to %s: %s", route, r.Dest, connLine(r))
			}
			return nil
		})
		share("in-node on "+n.Name, box.once(t, loadTimeout, slices.Repeat([]netip.AddrPort{route}, conns)...), true)
	}
	var outside []connResult
	for range conns {
		outside = append(outside, oneConn(route, "", false, loadTimeout))
	}
	share("outside (kube-proxy to the activators)", outside, false)
}

// ipv6AddressOf is [IPv6 cluster IP]:80 of a Kubernetes Service in appNS
// (a Route's address, a Revision's public Service), once it has one, with
// a local route.
func ipv6AddressOf(t *testing.T, s *stack.Stack, name string) netip.AddrPort {
	t.Helper()
	var addr netip.AddrPort
	e2etest.Eventually(t, 30*time.Second, "Service "+name+"'s IPv6 cluster IP", func() error {
		var svc corev1.Service
		if err := s.Client.Get(context.Background(), client.ObjectKey{Namespace: appNS, Name: name}, &svc); err != nil {
			return err
		}
		for _, a := range svc.Spec.ClusterIPs {
			if ip, err := netip.ParseAddr(a); err == nil && ip.Is6() && len(svc.Spec.Ports) > 0 {
				addr = netip.AddrPortFrom(ip, uint16(svc.Spec.Ports[0].Port))
				return nil
			}
		}
		return fmt.Errorf("cluster IPs %v (policy %v): none IPv6", svc.Spec.ClusterIPs, ptr.Deref(svc.Spec.IPFamilyPolicy, ""))
	})
	localRoute(t, addr.Addr())
	return addr
}
