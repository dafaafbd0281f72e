package cachetrim

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sockscale/sockscale/activator/internal/readiness"
	"github.com/sockscale/sockscale/activator/internal/resolve"
	"github.com/sockscale/sockscale/activator/internal/target"
	"github.com/sockscale/sockscale/activator/internal/throttle"
	"github.com/sockscale/sockscale/activator/internal/watch"
	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

// sinks records what the watcher tells the table, throttle and prober.
type sinks struct {
	Targets  map[target.Key]target.Target
	Services map[target.Key]resolve.RouteService
	Settings map[target.Key]throttle.Settings
	Pods     map[target.Key][]readiness.Pod
	Deleted  []target.Key
}

func newSinks() *sinks {
	return &sinks{Targets: map[target.Key]target.Target{}, Services: map[target.Key]resolve.RouteService{},
		Settings: map[target.Key]throttle.Settings{}, Pods: map[target.Key][]readiness.Pod{}}
}

type table struct{ *sinks }
type throttles struct{ *sinks }
type prober struct{ *sinks }

func (s table) Upsert(t target.Target) error { s.Targets[t.Key] = t; return nil }
func (s table) UpsertRouteService(r resolve.RouteService) error {
	s.Services[r.Key] = r
	return nil
}
func (s table) Delete(k target.Key)                      { s.Deleted = append(s.Deleted, k) }
func (s table) UpsertRoute(resolve.Route)                {}
func (s table) DeleteRoute(target.Key)                   {}
func (s throttles) Delete(target.Key)                    {}
func (s prober) Delete(target.Key)                       {}
func (s prober) SetPods(k target.Key, p []readiness.Pod) { s.Pods[k] = p }
func (s throttles) Update(k target.Key, st throttle.Settings) error {
	s.Settings[k] = st
	return nil
}

func testScheme(t testing.TB) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme, servingv1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// reader is a fake cache holding objs, with the watcher's indexes.
func reader(t *testing.T, objs ...client.Object) client.Reader {
	b := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...)
	for _, ix := range watch.Indexes() {
		b = b.WithIndex(ix.Object, ix.Field, ix.Extract)
	}
	return b.Build()
}

// trim is what the cache would hold of each object: Options' transform
// of its type, else the default one.
func trim(t *testing.T, objs []client.Object) []client.Object {
	t.Helper()
	o := Options()
	var out []client.Object
	for _, obj := range objs {
		transform := o.DefaultTransform
		for typ, by := range o.ByObject {
			if by.Transform != nil && typeOf(typ) == typeOf(obj) {
				transform = by.Transform
			}
		}
		got, err := transform(obj.DeepCopyObject())
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, got.(client.Object))
	}
	return out
}

func typeOf(o client.Object) string { return fmt.Sprintf("%T", o) }

// cluster is a target (hello: PodAutoscaler, ServerlessService with
// activators, public and private Services, two private slices, an
// Ingress), a serving Route's Services, and what surrounds them: the
// public Service's own slice, a tenant's Service named like a private one
// with its slice, a mirrored slice, an IPv6 one.
func cluster() []client.Object {
	pa := autoscaler("hello", "hello")
	sks := serverless(pa, "activator-b", "activator-a")
	public := userService("shop", "hello")
	private := privateService(sks)
	mirrored := privateSlice(private, 3, 500, 10)
	mirrored.Labels[discoveryv1.LabelManagedBy] = "endpointslicemirroring-controller.k8s.io"
	ipv6 := privateSlice(private, 4, 600, 0)
	ipv6.AddressType = discoveryv1.AddressTypeIPv6
	ipv6.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{"fd00::1"}}}
	// A tenant's Service called like a private one: its slices keep
	// their endpoints, but are not the ServerlessService's.
	squatter := userService("shop", "cart-private")
	return []client.Object{
		pa, sks, public, private,
		privateSlice(private, 1, 1, 100), privateSlice(private, 2, 90, 30), mirrored, ipv6,
		userSlice(public, 100),
		squatter, userSlice(squatter, 20),
		userIngress("shop", "hello", "hello"),
		userIngress("shop", "other", "cart"),
		routeService("web", "web", ""), routeService("web-canary", "web", "canary"),
		userIngress("shop", "web", "web"),
	}
}

var keys = []target.Key{{Namespace: "shop", Name: "hello"}, {Namespace: "shop", Name: "cart"}, {Namespace: "shop", Name: "web"},
	{Namespace: "shop", Name: "web-canary"}, {Namespace: "shop", Name: "hello-private"}}

// syncAll runs Watcher.Sync on every key against a cache holding objs.
func syncAll(t *testing.T, objs []client.Object) *sinks {
	t.Helper()
	s := newSinks()
	w := &watch.Watcher{Table: table{s}, Throttle: throttles{s}, Pods: prober{s}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	r := reader(t, objs...)
	for _, k := range keys {
		if err := w.Sync(context.Background(), r, k); err != nil {
			t.Fatalf("sync %s: %v", k, err)
		}
	}
	return s
}

// TestTrimmedObjectsYieldTheSameView: the watcher tells the table,
// throttle and prober the same from trimmed objects as from whole ones.
func TestTrimmedObjectsYieldTheSameView(t *testing.T) {
	objs := cluster()
	whole, trimmed := syncAll(t, objs), syncAll(t, trim(t, objs))
	hello := target.Key{Namespace: "shop", Name: "hello"}
	// The scenario must reach every field: a target with hosts, H2C,
	// activators and pods (some not ready), and Route Services.
	if tg := whole.Targets[hello]; len(tg.Hosts) == 0 || !tg.H2C || len(whole.Settings[hello].Activators) != 2 ||
		len(whole.Pods[hello]) < 90 || len(whole.Services) != 2 {
		t.Fatalf("the scenario does not exercise the watcher: %+v", whole)
	}
	if diff := cmp.Diff(whole, trimmed, cmpopts.EquateComparable(netip.Addr{}, netip.AddrPort{})); diff != "" {
		t.Errorf("what the watcher made of trimmed objects (-whole +trimmed):\n%s", diff)
	}
}

// TestWhatIsKept: each type keeps what the package doc lists, and loses
// the rest.
func TestWhatIsKept(t *testing.T) {
	svc := userService("shop", "hello")
	out, err := Service(svc.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	want := &corev1.Service{TypeMeta: svc.TypeMeta, ObjectMeta: *svc.ObjectMeta.DeepCopy(), Spec: corev1.ServiceSpec{
		ClusterIP: svc.Spec.ClusterIP, ClusterIPs: svc.Spec.ClusterIPs, Ports: []corev1.ServicePort{
			{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, AppProtocol: svc.Spec.Ports[0].AppProtocol},
			{Name: "metrics", Protocol: corev1.ProtocolTCP, Port: 9090},
			{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53},
		}}}
	want.Annotations, want.ManagedFields = nil, nil
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("trimmed Service (-want +got):\n%s", diff)
	}

	ing := userIngress("shop", "hello", "hello")
	out, err = Ingress(ing.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	name := func(n string) networkingv1.IngressBackend {
		return networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: n}}
	}
	wantIng := &networkingv1.Ingress{TypeMeta: ing.TypeMeta, ObjectMeta: *ing.ObjectMeta.DeepCopy(), Spec: networkingv1.IngressSpec{
		DefaultBackend: ptrTo(name("hello")),
		Rules: []networkingv1.IngressRule{
			{Host: "www.hello.example.com", IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
				Paths: []networkingv1.HTTPIngressPath{{Backend: name("hello")}}}}},
			{Host: "api.hello.example.com", IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
				Paths: []networkingv1.HTTPIngressPath{{Backend: name("hello-api")}}}}},
		}}}
	wantIng.Annotations, wantIng.ManagedFields = nil, nil
	if diff := cmp.Diff(wantIng, out); diff != "" {
		t.Errorf("trimmed Ingress (-want +got):\n%s", diff)
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestEndpointsAreKeptWherePodsMayBeRead: a slice keeps its endpoints'
// addresses and ready and terminating conditions only where the watcher
// could take pods from it; every slice keeps its labels, owner, address
// type and ports, what decides.
func TestEndpointsAreKeptWherePodsMayBeRead(t *testing.T) {
	pa := autoscaler("hello", "hello")
	private := privateService(serverless(pa))
	for _, tt := range []struct {
		name      string
		edit      func(*discoveryv1.EndpointSlice)
		endpoints bool
	}{
		{"of a private Service", func(*discoveryv1.EndpointSlice) {}, true},
		{"of a public Service", func(s *discoveryv1.EndpointSlice) { s.Labels[discoveryv1.LabelServiceName] = "hello" }, false},
		{"of a Service named only the suffix", func(s *discoveryv1.EndpointSlice) { s.Labels[discoveryv1.LabelServiceName] = watch.PrivateSuffix }, false},
		{"of no Service", func(s *discoveryv1.EndpointSlice) { delete(s.Labels, discoveryv1.LabelServiceName) }, false},
		{"mirrored", func(s *discoveryv1.EndpointSlice) {
			s.Labels[discoveryv1.LabelManagedBy] = "endpointslicemirroring-controller.k8s.io"
		}, false},
		{"written by someone else", func(s *discoveryv1.EndpointSlice) { delete(s.Labels, discoveryv1.LabelManagedBy) }, false},
		{"IPv6", func(s *discoveryv1.EndpointSlice) {
			s.AddressType = discoveryv1.AddressTypeIPv6
			for i := range s.Endpoints {
				s.Endpoints[i].Addresses = []string{fmt.Sprintf("fd00:244::%d", i+1)}
			}
		}, true},
		{"FQDN", func(s *discoveryv1.EndpointSlice) { s.AddressType = discoveryv1.AddressTypeFQDN }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := privateSlice(private, 1, 1, 5)
			tt.edit(s)
			out, err := EndpointSlice(s.DeepCopy())
			if err != nil {
				t.Fatal(err)
			}
			want := s.DeepCopy()
			want.Annotations, want.ManagedFields = nil, nil
			want.Endpoints = nil
			if tt.endpoints {
				for _, ep := range s.Endpoints {
					// The pod's name stays: it tells a dual-stack pod's two
					// endpoints for one pod.
					want.Endpoints = append(want.Endpoints, discoveryv1.Endpoint{Addresses: ep.Addresses,
						Conditions: discoveryv1.EndpointConditions{Ready: ep.Conditions.Ready, Terminating: ep.Conditions.Terminating},
						TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: ep.TargetRef.Name}})
				}
			}
			if diff := cmp.Diff(want, out); diff != "" {
				t.Errorf("cached slice (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSockscalesOwnObjectsStayWhole: PodAutoscalers, ServerlessServices,
// Routes and HTTPRoutes lose their managed fields only.
func TestSockscalesOwnObjectsStayWhole(t *testing.T) {
	o := Options()
	if len(o.ByObject) != 6 {
		t.Errorf("%d types trimmed, want Service, EndpointSlice, Ingress, Pod, Namespace and NetworkPolicy only", len(o.ByObject))
	}
	pa := autoscaler("hello", "hello")
	route := &servingv1alpha1.Route{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", Annotations: map[string]string{"a": "b"},
		ManagedFields: pa.ManagedFields}, Status: servingv1alpha1.RouteStatus{RouteStatusFields: servingv1alpha1.RouteStatusFields{
		Traffic: []servingv1alpha1.TrafficTargetStatus{{RevisionName: "web-1", Percent: ptrTo[int64](100)}}}}}
	httpRoute := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
		"metadata": map[string]any{"namespace": "shop", "name": "web", "annotations": map[string]any{"a": "b"},
			"managedFields": []any{map[string]any{"manager": "kubectl", "operation": "Update"}}},
		"spec": map[string]any{"hostnames": []any{"web.example.com"}}}}
	for _, obj := range []client.Object{pa, serverless(pa, "activator-a"), route, httpRoute} {
		got := trim(t, []client.Object{obj})[0]
		want := obj.DeepCopyObject().(client.Object)
		want.SetManagedFields(nil)
		if diff := cmp.Diff(want, got); diff != "" || len(obj.GetManagedFields()) == 0 {
			t.Errorf("cached %T (-want +got):\n%s", obj, diff)
		}
	}
}

// TestOtherObjectsPassThrough: what the informer hands over that is not
// the type a transform is for (a tombstone) comes out as it went in.
func TestOtherObjectsPassThrough(t *testing.T) {
	tomb := toolscache.DeletedFinalStateUnknown{Key: "shop/hello", Obj: userService("shop", "hello")}
	for name, transform := range map[string]toolscache.TransformFunc{"Service": Service, "EndpointSlice": EndpointSlice, "Ingress": Ingress,
		"Pod": Pod, "Namespace": Namespace, "NetworkPolicy": NetworkPolicy} {
		out, err := transform(tomb)
		if err != nil || !cmp.Equal(out, tomb) {
			t.Errorf("%s transform of a tombstone: %v, %v", name, out, err)
		}
	}
}
