package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/loadgen"
	"github.com/sockscale/sockscale/test/cluster"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// TestE2EIPv6Targets: on the dual-stack local cluster, a target whose
// public Service is IPv6 only and one whose Service is dual-stack, both
// called from outside the nodes through kube-proxy (its ip6tables rules for
// the IPv6 cluster IPs):
//
//   - at zero, the public Service's IPv6 EndpointSlice lists the
//     activators' IPv6 addresses, and a request to the IPv6 cluster IP is
//     held by an activator and answered by a pod of the target;
//   - 8 requests in flight (over IPv6, or half over each family) are
//     counted: the target's stable concurrency is the offered 8 (the
//     agents count each pod address in its own kernel slot and report a
//     pod once);
//   - idle, it goes back to zero, and a request over IPv6 wakes it again.
func TestE2EIPv6Targets(t *testing.T) {
	t.Parallel() // with the package's other parallel scenarios
	s := up(t)
	for _, tc := range []struct {
		name     string
		families []corev1.IPFamily
		policy   corev1.IPFamilyPolicy
	}{
		{"v6only", []corev1.IPFamily{corev1.IPv6Protocol}, corev1.IPFamilyPolicySingleStack},
		{"dualstack", []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}, corev1.IPFamilyPolicyRequireDualStack},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ipv6Target(t, s, tc.name, tc.families, tc.policy)
		})
	}
}

// ipv6Target runs TestE2EIPv6Targets for one target.
func ipv6Target(t *testing.T, s *stack.Stack, name string, families []corev1.IPFamily, policy corev1.IPFamilyPolicy) {
	ctx := context.Background()
	app := stack.App{Namespace: appNS, Name: name,
		Service: func(svc *corev1.ServiceSpec) { svc.IPFamilies, svc.IPFamilyPolicy = families, &policy },
		Spec: func(p *v1alpha1.PodAutoscalerSpec) {
			p.InitialScale, p.MinScale, p.MaxScale = ptr.To(int32(0)), ptr.To(int32(0)), ptr.To(int32(3))
			p.Target = ptr.To(10.0)
			p.TargetBurstCapacity = ptr.To(0.0)
			p.Window = &metav1.Duration{Duration: 10 * time.Second}
		}}
	if err := s.Deploy(ctx, app); err != nil {
		t.Fatal(err)
	}
	removeAtEnd(t, s, name)

	// One URL per cluster IP, IPv6 last; each with a local route.
	var urls []string
	var v6URL string
	e2etest.Eventually(t, time.Minute, name+"'s cluster IPs", func() error {
		var svc corev1.Service
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: name}, &svc); err != nil {
			return err
		}
		if len(svc.Spec.ClusterIPs) != len(families) {
			return fmt.Errorf("cluster IPs %v, want one per family of %v", svc.Spec.ClusterIPs, families)
		}
		urls = nil
		for _, a := range svc.Spec.ClusterIPs {
			ip, err := netip.ParseAddr(a)
			if err != nil || !cluster.ServiceCIDR.Contains(ip) && !cluster.ServiceCIDR6.Contains(ip) {
				return fmt.Errorf("cluster IP %q is in neither service range (%s, %s)", a, cluster.ServiceCIDR, cluster.ServiceCIDR6)
			}
			localRoute(t, ip)
			u := fmt.Sprintf("http://%s/", netip.AddrPortFrom(ip, uint16(svc.Spec.Ports[0].Port)))
			urls = append(urls, u)
			if ip.Is6() {
				v6URL = u
			}
		}
		return nil
	})

	// At zero: the IPv6 slice names the activators' IPv6 addresses.
	activatorsInPath := func() error {
		if pa := paOf(t, s, name); pa.Status.Mode != v1alpha1.ModeProxy {
			return fmt.Errorf("mode %q, want Proxy: %s", pa.Status.Mode, paLine(t, s, name))
		}
		want, err := activatorIPv6(ctx, s)
		if err != nil {
			return err
		}
		got, err := publicIPv6Endpoints(ctx, s, name)
		if err != nil {
			return err
		}
		if len(want) == 0 || !slices.Equal(got, want) {
			return fmt.Errorf("IPv6 endpoints %v, want the ready activators' %v; %s", got, want, paLine(t, s, name))
		}
		// kube-proxy has the slice once a connection to the IPv6 cluster
		// IP is accepted (by an activator); no request is sent, which
		// would be held and wake the target.
		conn, err := net.DialTimeout("tcp", strings.TrimSuffix(strings.TrimPrefix(v6URL, "http://"), "/"), time.Second)
		if err != nil {
			return fmt.Errorf("connect to the IPv6 cluster IP: %w", err)
		}
		return conn.Close()
	}
	e2etest.Eventually(t, time.Minute, name+"'s IPv6 EndpointSlice lists the activators", activatorsInPath)
	wake := func(when string) {
		t.Helper()
		a := get(oneShotClient(2*time.Minute), v6URL+"?sleep=0")
		if a.err != nil || a.code != 200 || !strings.HasPrefix(podOf(a.body), name+"-") {
			t.Fatalf("%s, a request to %s: %v, want it answered by a pod of %s", when, v6URL, a, name)
		}
		t.Logf("%s: a request over IPv6 answered by %s after %s (%s %s)", when, podOf(a.body), a.took.Round(time.Millisecond),
			v1alpha1.ColdStartHeader, a.header.Get(v1alpha1.ColdStartHeader))
	}
	wake("at zero")

	// 8 in flight, spread over the URLs (half per family if dual-stack).
	const inFlight = 8
	var loads []*loadgen.Load
	for _, u := range urls {
		loads = append(loads, loadgen.Start(ctx, loadgen.Options{URLs: []string{u + "?sleep=200"}, Concurrency: inFlight / len(urls), KeepAlive: false}))
	}
	start := time.Now()
	time.Sleep(16 * time.Second) // the 10 s window within the load, after the first pods' start
	stable := paOf(t, s, name).Status.StableValue
	for _, l := range loads {
		if r := l.Stop(); r.Failed > 0 {
			t.Errorf("%d of %d requests failed; the first: %v", r.Failed, r.Completed+r.Failed, r.FirstError)
		}
	}
	got, err := strconv.ParseFloat(stable, 64)
	// New connections and the client's own time make the pods' share a
	// little below the offered 8; a family not counted would halve it.
	if err != nil || got < 0.85*inFlight || got > 1.05*inFlight {
		t.Errorf("stable concurrency %q after %s at %d in flight, want within -15 %%..+5 %% of %d", stable, time.Since(start).Round(time.Second), inFlight, inFlight)
	}
	t.Logf("%d in flight over %d famil(ies): stable concurrency %s: %s", inFlight, len(urls), stable, paLine(t, s, name))

	idle := time.Now()
	e2etest.Eventually(t, 3*time.Minute, name+" back to zero", func() error {
		var d appsv1.Deployment
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: appNS, Name: name}, &d); err != nil {
			return err
		}
		if ptr.Deref(d.Spec.Replicas, 1) != 0 || d.Status.ReadyReplicas != 0 {
			return fmt.Errorf("Deployment wants %d, %d ready: %s", ptr.Deref(d.Spec.Replicas, 1), d.Status.ReadyReplicas, paLine(t, s, name))
		}
		return activatorsInPath()
	})
	t.Logf("idle: zero after %s", time.Since(idle).Round(time.Second))
	wake("at zero again")
}

// activatorIPv6 lists the ready activators' IPv6 addresses, sorted.
func activatorIPv6(ctx context.Context, s *stack.Stack) ([]string, error) {
	var pods corev1.PodList
	if err := s.Client.List(ctx, &pods, client.InNamespace(stack.Namespace), client.MatchingLabels{"app.kubernetes.io/component": "activator"}); err != nil {
		return nil, err
	}
	var out []string
	for _, p := range pods.Items {
		ready := false
		for _, c := range p.Status.Conditions {
			ready = ready || c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		}
		if !ready || p.DeletionTimestamp != nil {
			continue
		}
		for _, a := range p.Status.PodIPs {
			if ip, err := netip.ParseAddr(a.IP); err == nil && ip.Is6() && cluster.ClusterCIDR6.Contains(ip) {
				out = append(out, ip.String())
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// publicIPv6Endpoints lists the ready addresses of the public Service's
// IPv6 EndpointSlices that sockscale wrote, sorted.
func publicIPv6Endpoints(ctx context.Context, s *stack.Stack, name string) ([]string, error) {
	var list discoveryv1.EndpointSliceList
	if err := s.Client.List(ctx, &list, client.InNamespace(appNS), client.MatchingLabels{discoveryv1.LabelServiceName: name}); err != nil {
		return nil, err
	}
	var out []string
	for _, sl := range list.Items {
		if sl.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		for _, e := range sl.Endpoints {
			if ptr.Deref(e.Conditions.Ready, false) {
				out = append(out, e.Addresses...)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}
