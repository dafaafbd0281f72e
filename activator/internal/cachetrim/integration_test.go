package cachetrim

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	"github.com/sockscale/sockscale/activator/internal/readiness"
	"github.com/sockscale/sockscale/activator/internal/resolve"
	"github.com/sockscale/sockscale/activator/internal/target"
	"github.com/sockscale/sockscale/activator/internal/throttle"
	"github.com/sockscale/sockscale/activator/internal/watch"
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

// TestIntegrationTheCacheHoldsTrimmedObjects: through the real API server
// and a cache with the activator's Options, Services, EndpointSlices and
// Ingresses arrive trimmed (no managed fields, no annotations, a foreign
// slice without endpoints), and the watcher on that cache still serves
// the target: its address, its host from the Ingress and its pods.
func TestIntegrationTheCacheHoldsTrimmedObjects(t *testing.T) {
	cl := testenv.ControlPlane(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	create := func(o client.Object) {
		t.Helper()
		o.SetResourceVersion("")
		o.SetUID("")
		o.SetManagedFields(nil)
		o.SetCreationTimestamp(metav1.Time{})
		if err := cl.Client.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
	clusterIP := func(s *corev1.Service) *corev1.Service {
		s.Spec.Type, s.Spec.ClusterIP, s.Spec.ClusterIPs, s.Status = corev1.ServiceTypeClusterIP, "", nil, corev1.ServiceStatus{}
		s.Spec.ExternalTrafficPolicy, s.Spec.AllocateLoadBalancerNodePorts = "", nil
		for i := range s.Spec.Ports {
			s.Spec.Ports[i].NodePort = 0
		}
		return s
	}
	create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})
	pa := autoscaler("hello", "hello")
	create(pa)
	sks := serverless(pa) // after pa's create: the reference has its UID
	create(sks)
	public := clusterIP(userService("shop", "hello"))
	create(public)
	private := clusterIP(privateService(sks))
	create(private)
	create(privateSlice(private, 1, 1, 10))
	foreign := userSlice(public, 100)
	create(foreign)
	create(userIngress("shop", "hello", "hello"))

	mapper, err := apiutil.NewDynamicRESTMapper(cl.Config, must(rest.HTTPClientFor(cl.Config)))
	if err != nil {
		t.Fatal(err)
	}
	o := Options()
	o.Scheme, o.Mapper = testScheme(t), mapper
	c, err := cache.New(cl.Config, o)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	tbl := resolve.NewTable("")
	pods := &lockedPods{pods: map[target.Key][]readiness.Pod{}}
	w := &watch.Watcher{Cache: c, Table: tbl, Throttle: throttle.New(throttle.Options{Self: "activator-a"}), Pods: pods,
		Mapper: mapper, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	go func() { _ = w.Run(ctx) }()

	hello := target.Key{Namespace: "shop", Name: "hello"}
	testenv.Eventually(t, 30*time.Second, "the target resolves by its Ingress host", func() (bool, string) {
		got, err := tbl.Resolve("", "www.hello.example.com")
		if err != nil {
			return false, err.Error()
		}
		return got.Key == hello && got.H2C && len(got.ClusterIPs) == 1, fmt.Sprintf("%+v", got)
	})
	testenv.Eventually(t, 30*time.Second, "the private slice's pods reach the prober", func() (bool, string) {
		// Pods 1..10: 5 and 10 terminating, 3, 6 and 9 not ready; probed
		// over h2c, as the Service's port says.
		var want []readiness.Pod
		for j := 1; j <= 10; j++ {
			if j%5 != 0 {
				want = append(want, readiness.Pod{Addr: netip.MustParseAddrPort(fmt.Sprintf("10.244.0.%d:8080", j)), Ready: j%3 != 0, H2C: true})
			}
		}
		diff := cmp.Diff(want, pods.get(hello), cmpopts.EquateComparable(netip.AddrPort{}))
		return diff == "", diff
	})

	get := func(name string, obj client.Object) {
		t.Helper()
		if err := c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: name}, obj); err != nil {
			t.Fatal(err)
		}
		if len(obj.GetManagedFields()) != 0 || len(obj.GetAnnotations()) != 0 {
			t.Errorf("cached %T %s kept %d managed fields, annotations %v", obj, name, len(obj.GetManagedFields()), obj.GetAnnotations())
		}
	}
	var svc corev1.Service
	get("hello", &svc)
	if svc.Spec.Selector != nil || svc.Spec.Ports[0].TargetPort.String() != "0" || svc.Labels["team"] != "checkout" || svc.Spec.ClusterIP == "" {
		t.Errorf("cached Service: selector %v, target port %v, labels %v, clusterIP %q", svc.Spec.Selector, svc.Spec.Ports[0].TargetPort, svc.Labels, svc.Spec.ClusterIP)
	}
	get(private.Name, &svc)
	if !metav1.IsControlledBy(&svc, sks) {
		t.Errorf("the cached private Service lost its controller: %v", svc.OwnerReferences)
	}
	var s discoveryv1.EndpointSlice
	get(foreign.Name, &s)
	if len(s.Endpoints) != 0 || len(s.OwnerReferences) != 1 || s.Labels[discoveryv1.LabelServiceName] != "hello" {
		t.Errorf("cached foreign slice: %d endpoints (want none), owners %v, labels %v", len(s.Endpoints), s.OwnerReferences, s.Labels)
	}
	get(private.Name+"-1", &s)
	// Of the targetRef only what tells a dual-stack pod's two endpoints
	// for one pod.
	if len(s.Endpoints) != 10 || s.Endpoints[0].NodeName != nil ||
		s.Endpoints[0].TargetRef == nil || *s.Endpoints[0].TargetRef != (corev1.ObjectReference{Kind: "Pod", Name: "hello-abc-1"}) {
		t.Errorf("cached private slice: %d endpoints (want 10), first %+v", len(s.Endpoints), s.Endpoints)
	}
	var ing networkingv1.Ingress
	get("hello", &ing)
	if ing.Spec.TLS != nil || ing.Spec.IngressClassName != nil || ing.Spec.Rules[0].HTTP.Paths[0].Path != "" {
		t.Errorf("cached Ingress kept what the watcher does not read: %+v", ing.Spec)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
