package watch

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/sockscale/sockscale/activator/internal/readiness"
	"github.com/sockscale/sockscale/activator/internal/resolve"
	"github.com/sockscale/sockscale/activator/internal/target"
	"github.com/sockscale/sockscale/activator/internal/throttle"
	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/owned"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// lockedPods records the prober's input from the watcher's goroutine.
type lockedPods struct {
	mu   sync.Mutex
	pods map[target.Key][]readiness.Pod
}

func (p *lockedPods) SetPods(k target.Key, pods []readiness.Pod) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pods[k] = pods
}

func (p *lockedPods) Delete(k target.Key) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.pods, k)
}

func (p *lockedPods) get(k target.Key) []readiness.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pods[k]
}

// TestIntegrationWatcherFollowsTheCluster runs the watcher on a real
// kube-apiserver's watches: a target appears in the resolution table with
// its Service's ClusterIP once its PodAutoscaler and Service exist, follows
// an edit, gets its pods from the private EndpointSlices, and is gone
// (404) once its PodAutoscaler is deleted.
func TestIntegrationWatcherFollowsTheCluster(t *testing.T) {
	cl := testenv.ControlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := cl.Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}}); err != nil {
		t.Fatal(err)
	}
	svc := service("hello", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs = "", nil // the API server assigns one
	p := pa("hello", "hello", 0)
	p.CreationTimestamp = metav1.Time{}
	p.Spec.ContainerConcurrency = 2
	p.Spec.TimeoutSeconds = ptr.To(int32(30))
	p.Spec.Activator = &v1alpha1.ActivatorSpec{QueueDepth: ptr.To(int32(7))}
	if err := c.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	createTarget(ctx, t, c, p, slice("hello-private-abcde", "hello-private", map[string]int32{"http": 8080}, ep{ip: "10.244.1.7", ready: true}))

	cl.InstallHTTPRouteCRD(t)
	mapper, err := apiutil.NewDynamicRESTMapper(cl.Config, must(rest.HTTPClientFor(cl.Config)))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := cache.New(cl.Config, cache.Options{Scheme: scheme(t), Mapper: mapper})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = ca.Start(ctx) }()
	table := resolve.NewTable("")
	pods := &lockedPods{pods: map[target.Key][]readiness.Pod{}}
	w := &Watcher{Cache: ca, Table: table, Throttle: throttle.New(throttle.Options{Self: "activator-a"}), Pods: pods,
		Mapper: mapper, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	eventually(t, "the target resolves with its PodAutoscaler's settings", func() string {
		got, err := table.Resolve("", "hello.team.svc.cluster.local:80")
		if err != nil {
			return err.Error()
		}
		want := target.Target{Key: hello, ClusterIPs: []netip.Addr{netip.MustParseAddr(svc.Spec.ClusterIP)}, Ports: []uint16{80},
			ContainerConcurrency: 2, Timeout: 30 * time.Second, ColdStartHeader: true, QueueDepth: 7}
		return cmp.Diff(want, *got, cmpopts.EquateComparable(netip.Addr{}))
	})
	if got, err := table.Resolve("", svc.Spec.ClusterIP+":80"); err != nil || got.Key != hello {
		t.Errorf("the ClusterIP %s does not resolve to %s: %v", svc.Spec.ClusterIP, hello, err)
	}
	eventually(t, "the private EndpointSlice's pod reaches the prober", func() string {
		return cmp.Diff([]readiness.Pod{{Addr: netip.MustParseAddrPort("10.244.1.7:8080"), Ready: true}}, pods.get(hello),
			cmpopts.EquateComparable(netip.AddrPort{}))
	})

	// Host names of routes whose backend is the public Service: an
	// Ingress rule, and an HTTPRoute a Gateway accepted (the Gateway API
	// is "installed": its CRD exists, so HTTPRoutes are watched).
	route := httpRoute("team", "shop", 0, nil, []string{"shop.example.com"}, "hello")
	for _, o := range []client.Object{ingress("www", "", rule("www.example.com", "hello")), route} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	setParents(ctx, t, c, "team", "shop", "True", 0)
	for _, host := range []string{"www.example.com", "shop.example.com"} {
		eventually(t, host+" resolves to the target", func() string {
			got, err := table.Resolve("", host)
			if err != nil {
				return err.Error()
			}
			return cmp.Diff(hello, got.Key)
		})
	}

	p.Spec.ContainerConcurrency = 5
	if err := c.Update(ctx, p); err != nil {
		t.Fatal(err)
	}
	eventually(t, "an edit of the PodAutoscaler is followed", func() string {
		got, err := table.Resolve("", "hello.team")
		if err != nil {
			return err.Error()
		}
		return cmp.Diff(5, got.ContainerConcurrency)
	})

	if err := c.Delete(ctx, p); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a deleted PodAutoscaler's target no longer resolves", func() string {
		if _, err := table.Resolve("", "hello.team"); err == nil {
			return "hello.team still resolves"
		}
		if len(pods.get(hello)) != 0 {
			return "the prober still has the target's pods"
		}
		return ""
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// setParents writes an HTTPRoute's status as a Gateway's controller
// would: one parent whose Accepted condition is accepted ("True" or
// "False"), for generation gen (0: the route's current one).
func setParents(ctx context.Context, t *testing.T, c client.Client, ns, name, accepted string, gen int64) {
	t.Helper()
	u := newHTTPRoute()
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, u); err != nil {
		t.Fatal(err)
	}
	if gen == 0 {
		gen = u.GetGeneration()
	}
	u.Object["status"] = map[string]any{"parents": []any{map[string]any{
		"parentRef":      map[string]any{"name": "gw", "namespace": "infra"},
		"controllerName": "example.com/gateway",
		"conditions": []any{map[string]any{"type": "Accepted", "status": accepted, "reason": "Test", "message": "test",
			"observedGeneration": gen, "lastTransitionTime": time.Now().UTC().Format(time.RFC3339)}},
	}}}
	if err := c.Status().Update(ctx, u); err != nil {
		t.Fatalf("status of HTTPRoute %s/%s: %v", ns, name, err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// eventually polls check (a diff or a reason, "" when it holds) for 30 s.
func eventually(t *testing.T, what string, check func() string) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if last = check(); last == "" {
			return
		}
	}
	t.Fatalf("%s: still not so after 30 s: %s", what, last)
}

// TestIntegrationRoutesWatchedLater: while RBAC does not grant Routes,
// the watcher (as a user with the chart's rules but routes) syncs and
// serves public Services as before, and a Route's host says the Route is
// not known; once the ClusterRole grants routes, it watches them without
// a restart and the Route's host reaches its revision.
func TestIntegrationRoutesWatchedLater(t *testing.T) {
	cl := testenv.ControlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := cl.Client
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}}); err != nil {
		t.Fatal(err)
	}
	rev := service("hello-00001", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	rev.Spec.ClusterIP, rev.Spec.ClusterIPs = "", nil
	p := pa("hello-00001", "hello-00001", 0)
	p.CreationTimestamp = metav1.Time{}
	addr := service("hello", corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	addr.Spec.ClusterIP, addr.Spec.ClusterIPs = "", nil
	addr.Labels = map[string]string{servingv1alpha1.RouteLabelKey: "hello"}
	percent := int64(100)
	route := &servingv1alpha1.Route{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "hello"},
		Spec: servingv1alpha1.RouteSpec{Traffic: []servingv1alpha1.TrafficTarget{{RevisionName: "hello-00001", Percent: &percent}}}}
	// The activator's ClusterRole as the chart has it, but Routes.
	read := []string{"get", "list", "watch"}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "activator"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services", "pods"}, Verbs: read},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: read},
		{APIGroups: []string{"sockscale.dev"}, Resources: []string{"podautoscalers", "serverlessservices"}, Verbs: read},
		{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"ingresses"}, Verbs: read},
	}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "activator"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "activator"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "activator"}}}
	for _, o := range []client.Object{rev, p, addr, route, role, binding} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	route.Status.Traffic = []servingv1alpha1.TrafficTargetStatus{{RevisionName: "hello-00001", Percent: &percent}}
	if err := c.Status().Update(ctx, route); err != nil {
		t.Fatal(err)
	}

	// The watcher runs as the user "activator".
	cfg := rest.CopyConfig(cl.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "activator"}
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, must(rest.HTTPClientFor(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := cache.New(cfg, cache.Options{Scheme: scheme(t), Mapper: mapper})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = ca.Start(ctx) }()
	direct, err := client.New(cfg, client.Options{Scheme: scheme(t), Mapper: mapper})
	if err != nil {
		t.Fatal(err)
	}
	table := resolve.NewTable("")
	logs := &lockedBuffer{}
	w := &Watcher{Cache: ca, Table: table, Throttle: throttle.New(throttle.Options{Self: "activator-a"}),
		Pods: &lockedPods{pods: map[target.Key][]readiness.Pod{}}, APIReader: direct, RouteRetryPeriod: 100 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(logs, nil))}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	eventually(t, "synced, the revision served, without Routes", func() string {
		if !w.Synced() {
			return "not synced"
		}
		if _, err := table.Resolve("", "hello-00001.team"); err != nil {
			return err.Error()
		}
		return ""
	})
	if _, err := table.Resolve("", "hello.team"); !errors.Is(err, resolve.ErrRouteNotReady) || !strings.Contains(err.Error(), "which this activator does not know") {
		t.Errorf("the Route's host while Routes are not watched: %v, want ErrRouteNotReady saying the Route is not known", err)
	}

	time.Sleep(500 * time.Millisecond) // several retries
	if n := strings.Count(logs.String(), "serving Routes are not watched"); n != 1 || !strings.Contains(logs.String(), "RBAC forbids listing routes.serving.sockscale.dev") {
		t.Errorf("logged %d times that Routes are not watched, want once, saying RBAC forbids them:\n%s", n, logs.String())
	}

	role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{servingv1alpha1.GroupVersion.Group}, Resources: []string{"routes"}, Verbs: read})
	if err := c.Update(ctx, role); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Route's host reaches its revision once RBAC grants Routes", func() string {
		got, err := table.Resolve("", "hello.team:80")
		if err != nil {
			return err.Error()
		}
		return cmp.Diff(target.Key{Namespace: "team", Name: "hello-00001"}, got.Key)
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// lockedBuffer is a log sink written from the watcher's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// createTarget creates, through c, the PodAutoscaler p and what the
// controller and Kubernetes make of it: its ServerlessService, its private
// Service, and the slices computed for that Service.
func createTarget(ctx context.Context, t *testing.T, c client.Client, p *v1alpha1.PodAutoscaler, slices ...*discoveryv1.EndpointSlice) {
	t.Helper()
	if err := c.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	s := &v1alpha1.ServerlessService{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name},
		Spec: v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeServe, PublicService: p.Spec.Service.Name, Selector: map[string]string{"app": p.Name}}}
	if err := c.Create(ctx, owned.ServerlessService(s, p)); err != nil {
		t.Fatal(err)
	}
	private := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Spec.Service.Name + PrivateSuffix},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}, Selector: map[string]string{"app": p.Name}}}
	if err := c.Create(ctx, owned.PrivateService(private, s)); err != nil {
		t.Fatal(err)
	}
	for _, sl := range slices {
		if err := c.Create(ctx, owned.ComputedSlice(sl, private)); err != nil {
			t.Fatal(err)
		}
	}
}
