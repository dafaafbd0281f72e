package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/localroute"
	"github.com/sockscale/sockscale/test/cluster"
	"github.com/sockscale/sockscale/test/e2e/e2etest"
	"github.com/sockscale/sockscale/test/stack"
)

// unknownImage is an image the cluster's registry does not have: its
// pods wait in ErrImagePull and ImagePullBackOff and never answer, so
// the target has a pod (with an address) that never becomes ready.
const unknownImage = cluster.RegistryAddr + "/sockscale/never-pushed:0.1.0"

// removeAtEnd deletes the app when the test ends, so the pods of one
// scenario do not load the next.
func removeAtEnd(t *testing.T, s *stack.Stack, name string) {
	t.Cleanup(func() {
		if err := s.Remove(context.Background(), stack.App{Namespace: appNS, Name: name}); err != nil {
			t.Errorf("remove %s: %v", name, err)
		}
	})
}

// deployUnready deploys an app whose pods may never become ready, waits
// until its public Service routes to activators that know it, and returns
// its public URL.
func deployUnready(t *testing.T, s *stack.Stack, app stack.App) string {
	t.Helper()
	ctx := context.Background()
	app.Namespace = appNS
	if err := s.Deploy(ctx, app); err != nil {
		t.Fatal(err)
	}
	removeAtEnd(t, s, app.Name)
	var url string
	e2etest.Eventually(t, time.Minute, app.Name+"'s public Service routes to activators", func() error {
		var err error
		if url, err = s.PublicURL(ctx, appNS, app.Name); err != nil {
			return err
		}
		if err := expectActivatorEndpoints(ctx, s, app.Name); err != nil {
			return err
		}
		if err := activatorsKnow(ctx, s, app.Name); err != nil {
			return err
		}
		// kube-proxy has the Service's rules once a connection to its
		// ClusterIP is accepted (by an activator); no request is sent,
		// which would be held and wake the target.
		conn, err := net.DialTimeout("tcp", strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/"), time.Second)
		if err != nil {
			return fmt.Errorf("connect to the public Service: %w", err)
		}
		conn.Close()
		// kube-proxy picks any of the endpoints for the next connection:
		// each must take one from here (an activator replaced just before
		// may not yet be reachable from the host).
		addrs, ports, err := publicEndpoints(ctx, s, app.Name)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			for _, p := range ports {
				ap := net.JoinHostPort(a, fmt.Sprint(p))
				if err := localroute.Check(netip.MustParseAddr(a), localroute.DevPrefix("sccl-")); err != nil {
					return err
				}
				conn, err := net.DialTimeout("tcp", ap, time.Second)
				if err != nil {
					return fmt.Errorf("connect to the public endpoint %s: %w", ap, err)
				}
				conn.Close()
			}
		}
		return nil
	})
	return url
}

// activatorsKnow: every ready activator has the target in its throttle
// (its per-target series exist), so none answers 404 for it.
func activatorsKnow(ctx context.Context, s *stack.Stack, name string) error {
	return activatorsKnowIn(ctx, s, appNS, name)
}

// activatorsKnowIn is activatorsKnow for a target of namespace ns.
func activatorsKnowIn(ctx context.Context, s *stack.Stack, ns, name string) error {
	acts, err := s.Activators(ctx)
	if err != nil {
		return err
	}
	for _, a := range acts {
		if !a.Ready || a.Deleting {
			continue
		}
		m, err := s.Scrape(ctx, a.IP, stack.ActivatorMetricsPort)
		if err != nil {
			return err
		}
		found := false
		for _, smp := range m["sockscale_activator_pods"] {
			if smp.Labels["namespace"] == ns && smp.Labels["name"] == name {
				found = true
			}
		}
		if !found {
			return fmt.Errorf("activator %s does not know %s/%s yet", a.Name, ns, name)
		}
	}
	return nil
}

// expectActivatorEndpoints: the target is in Proxy mode and its public
// EndpointSlices hold exactly the ready activators' addresses (those in
// the PodAutoscaler's status), every port being the activators' proxy port.
func expectActivatorEndpoints(ctx context.Context, s *stack.Stack, name string) error {
	return expectActivatorEndpointsIn(ctx, s, appNS, name)
}

// expectActivatorEndpointsIn is expectActivatorEndpoints for a target of
// namespace ns.
func expectActivatorEndpointsIn(ctx context.Context, s *stack.Stack, ns, name string) error {
	pa, err := s.PA(ctx, ns, name)
	if err != nil {
		return err
	}
	if pa.Status.Mode != v1alpha1.ModeProxy {
		ready := meta.FindStatusCondition(pa.Status.Conditions, "Ready")
		return fmt.Errorf("mode %q, want Proxy (Ready: %+v)", pa.Status.Mode, ready)
	}
	acts, err := s.Activators(ctx)
	if err != nil {
		return err
	}
	ips := map[string]string{}
	for _, a := range acts {
		if a.Ready && !a.Deleting {
			ips[a.Name] = a.IP.String()
		}
	}
	if len(pa.Status.Activators) == 0 {
		return fmt.Errorf("no activators in the PodAutoscaler's status")
	}
	var want []string
	for _, n := range pa.Status.Activators {
		ip, ok := ips[n]
		if !ok {
			return fmt.Errorf("activator %s of the status is not a ready activator (ready: %v)", n, ips)
		}
		want = append(want, ip)
	}
	got, ports, err := publicEndpointsIn(ctx, s, ns, name)
	if err != nil {
		return err
	}
	sortAddrs(want)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		return fmt.Errorf("public endpoints %v, the activators in the path %v (%v)", got, want, pa.Status.Activators)
	}
	for _, p := range ports {
		if p != stack.ActivatorProxyPort {
			return fmt.Errorf("public endpoint port %d, want the activators' %d", p, stack.ActivatorProxyPort)
		}
	}
	return nil
}

// publicEndpoints are the addresses (sorted) and ports of the public
// Service's EndpointSlices.
func publicEndpoints(ctx context.Context, s *stack.Stack, name string) ([]string, []int32, error) {
	return publicEndpointsIn(ctx, s, appNS, name)
}

func publicEndpointsIn(ctx context.Context, s *stack.Stack, ns, name string) ([]string, []int32, error) {
	var slices discoveryv1.EndpointSliceList
	if err := s.Client.List(ctx, &slices, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: name}); err != nil {
		return nil, nil, err
	}
	var addrs []string
	var ports []int32
	for _, sl := range slices.Items {
		for _, e := range sl.Endpoints {
			addrs = append(addrs, e.Addresses...)
		}
		for _, p := range sl.Ports {
			if p.Port != nil {
				ports = append(ports, *p.Port)
			}
		}
	}
	sortAddrs(addrs)
	return addrs, ports, nil
}

func sortAddrs(a []string) {
	sort.Slice(a, func(i, j int) bool { return netip.MustParseAddr(a[i]).Less(netip.MustParseAddr(a[j])) })
}

// waitAtZero waits until every named target has scaled to zero: no pod
// wanted or left (terminating ones included: a draining pod still answers
// what the activator sends it, and a cold start measured while one does
// is none), Proxy mode.
func waitAtZero(t *testing.T, s *stack.Stack, timeout time.Duration, names ...string) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	for _, name := range names {
		e2etest.Eventually(t, timeout-time.Since(start), name+" at zero", func() error {
			pa, err := s.PA(ctx, appNS, name)
			if err != nil {
				return err
			}
			d, err := s.Deployment(ctx, appNS, name)
			if err != nil {
				return err
			}
			if *d.Spec.Replicas != 0 || d.Status.Replicas != 0 || pa.Status.Mode != v1alpha1.ModeProxy {
				return fmt.Errorf("%d pods wanted, %d left: %s", *d.Spec.Replicas, d.Status.Replicas, paLine(t, s, name))
			}
			var pods corev1.PodList
			if err := s.Client.List(ctx, &pods, client.InNamespace(appNS), client.MatchingLabels{"app": name}); err != nil {
				return err
			}
			if len(pods.Items) > 0 {
				return fmt.Errorf("%d pods still terminating", len(pods.Items))
			}
			return nil
		})
	}
	t.Logf("%v at zero after %s", names, time.Since(start).Round(time.Second))
}

// answer is one request's outcome as its client saw it.
type answer struct {
	code   int
	header http.Header
	body   string
	err    error
	end    time.Time
	took   time.Duration
}

func (a answer) String() string {
	if a.err != nil {
		return "error: " + a.err.Error()
	}
	return fmt.Sprintf("%d %q", a.code, strings.TrimSpace(a.body))
}

// get sends one GET with its own connection.
func get(c *http.Client, url string) answer {
	start := time.Now()
	resp, err := c.Get(url)
	if err != nil {
		return answer{err: err, end: time.Now(), took: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{code: resp.StatusCode, header: resp.Header, body: string(b), err: err, end: time.Now(), took: time.Since(start)}
}

// oneShotClient dials a new connection per request, so each request is
// load-balanced by kube-proxy on its own.
func oneShotClient(timeout time.Duration) *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}, Timeout: timeout}
}

// podOf is the pod named in the autoscale app's answer ("pod <name>: ...").
func podOf(body string) string {
	name, _, ok := strings.Cut(strings.TrimPrefix(body, "pod "), ":")
	if !ok || !strings.HasPrefix(body, "pod ") {
		return ""
	}
	return name
}

// raw sends a hand-written HTTP/1.1 request (with the final blank line
// added) on a new connection to addr and reads the answer.
func raw(addr netip.AddrPort, method, request string) answer {
	start := time.Now()
	conn, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
	if err != nil {
		return answer{err: err}
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.WriteString(conn, request+"Connection: close\r\n\r\n"); err != nil {
		return answer{err: err}
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: method})
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{code: resp.StatusCode, header: resp.Header, body: string(b), err: err, end: time.Now(), took: time.Since(start)}
}

// localRoute checks that traffic to ip stays on this machine: the route
// to it is one of the cluster's links (sccl-*).
func localRoute(t *testing.T, ip netip.Addr) {
	t.Helper()
	if err := localroute.Check(ip, localroute.DevPrefix("sccl-")); err != nil {
		t.Fatal(err)
	}
}

// readyActivators waits until want activators are ready and none is
// being deleted, and returns them.
func readyActivators(t *testing.T, s *stack.Stack, want int, timeout time.Duration) []stack.ActivatorPod {
	t.Helper()
	var acts []stack.ActivatorPod
	e2etest.Eventually(t, timeout, fmt.Sprintf("%d ready activators", want), func() error {
		all, err := s.Activators(context.Background())
		if err != nil {
			return err
		}
		acts = acts[:0]
		for _, a := range all {
			if a.Deleting || !a.Ready {
				return fmt.Errorf("activator %s: ready %v, deleting %v", a.Name, a.Ready, a.Deleting)
			}
			acts = append(acts, a)
		}
		if len(acts) != want {
			return fmt.Errorf("%d activators", len(acts))
		}
		return nil
	})
	return acts
}

// activatorSum adds a metric's series over every ready activator.
func activatorSum(ctx context.Context, s *stack.Stack, metric string, match map[string]string) (map[string]float64, float64, error) {
	acts, err := s.Activators(ctx)
	if err != nil {
		return nil, 0, err
	}
	per := map[string]float64{}
	var sum float64
	for _, a := range acts {
		if !a.IP.IsValid() {
			continue
		}
		m, err := s.Scrape(ctx, a.IP, stack.ActivatorMetricsPort)
		if err != nil {
			return nil, 0, err
		}
		v := stack.Sum(m, metric, match)
		per[a.Name] = v
		sum += v
	}
	return per, sum, nil
}
