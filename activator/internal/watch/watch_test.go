package watch

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sockscale/sockscale/activator/internal/readiness"
	"github.com/sockscale/sockscale/activator/internal/resolve"
	"github.com/sockscale/sockscale/activator/internal/target"
	"github.com/sockscale/sockscale/activator/internal/throttle"
	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/owned"
)

// sinks records what the watcher tells the table, throttle and prober.
type sinks struct {
	targets  map[target.Key]target.Target
	services map[target.Key]resolve.RouteService
	routes   map[target.Key]resolve.Route
	settings map[target.Key]throttle.Settings
	pods     map[target.Key][]readiness.Pod
	order    []string
}

func newSinks() *sinks {
	return &sinks{targets: map[target.Key]target.Target{}, services: map[target.Key]resolve.RouteService{}, routes: map[target.Key]resolve.Route{},
		settings: map[target.Key]throttle.Settings{}, pods: map[target.Key][]readiness.Pod{}}
}

type table struct{ *sinks }
type throttles struct{ *sinks }
type prober struct{ *sinks }

func (s table) Upsert(t target.Target) error {
	s.order = append(s.order, "table.Upsert")
	delete(s.services, t.Key)
	s.targets[t.Key] = t
	return nil
}
func (s table) UpsertRouteService(r resolve.RouteService) error {
	s.order = append(s.order, "table.UpsertRouteService")
	delete(s.targets, r.Key)
	s.services[r.Key] = r
	return nil
}
func (s table) Delete(k target.Key) {
	s.order = append(s.order, "table.Delete")
	delete(s.targets, k)
	delete(s.services, k)
}
func (s table) UpsertRoute(r resolve.Route) { s.routes[r.Key] = r }
func (s table) DeleteRoute(k target.Key)    { delete(s.routes, k) }
func (s throttles) Update(k target.Key, st throttle.Settings) error {
	s.order = append(s.order, "throttle.Update")
	s.settings[k] = st
	return nil
}
func (s throttles) Delete(k target.Key) {
	s.order = append(s.order, "throttle.Delete")
	delete(s.settings, k)
}
func (s prober) SetPods(k target.Key, p []readiness.Pod) {
	s.order = append(s.order, "pods.SetPods")
	s.pods[k] = p
}
func (s prober) Delete(k target.Key) { s.order = append(s.order, "pods.Delete"); delete(s.pods, k) }

// Builders of the objects a target is made of.

func pa(name, service string, created int64) *v1alpha1.PodAutoscaler {
	return &v1alpha1.PodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, UID: types.UID("pa-" + name), CreationTimestamp: metav1.Unix(created, 0)},
		Spec: v1alpha1.PodAutoscalerSpec{
			ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: name + "-deploy"},
			Service:        v1alpha1.ServiceRef{Name: service, Port: 80},
		},
	}
}

func service(name string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, UID: types.UID("svc-" + name)},
		Spec:       corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}, Ports: ports},
	}
}

// private is the private Service of public, made by the ServerlessService
// sksName (the controller's naming: the PodAutoscaler's name).
func private(sksName, public string) *corev1.Service {
	return owned.PrivateService(service(public+"-private", corev1.ServicePort{Name: "http", Port: 80}), sks(sksName, public))
}

func sks(name, public string, activators ...string) *v1alpha1.ServerlessService {
	return owned.ServerlessService(&v1alpha1.ServerlessService{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, UID: types.UID("sks-" + name)},
		Spec:       v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeProxy, PublicService: public},
		Status:     v1alpha1.ServerlessServiceStatus{Activators: activators},
	}, pa(name, public, 0))
}

type ep struct {
	ip                 string
	ready, terminating bool
	pod                string // the targetRef's name; none if ""
}

// slice is a slice the EndpointSlice controller computed for the Service
// named service (as built by the service builder): IPv6 when its first
// endpoint's address is.
func slice(name, svc string, ports map[string]int32, eps ...ep) *discoveryv1.EndpointSlice {
	family := discoveryv1.AddressTypeIPv4
	if len(eps) > 0 && strings.Contains(eps[0].ip, ":") {
		family = discoveryv1.AddressTypeIPv6
	}
	s := owned.ComputedSlice(&discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "team", Name: name},
		AddressType: family,
	}, service(svc))
	for n, p := range ports {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: ptr.To(n), Port: ptr.To(p), Protocol: ptr.To(corev1.ProtocolTCP)})
	}
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(e.ready), Terminating: ptr.To(e.terminating)}})
		if e.pod != "" {
			s.Endpoints[len(s.Endpoints)-1].TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "team", Name: e.pod}
		}
	}
	return s
}

func scheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := servingv1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

func reader(t *testing.T, objs ...client.Object) client.Reader {
	b := fake.NewClientBuilder().WithScheme(scheme(t)).WithObjects(objs...)
	for _, ix := range append(Indexes(), HTTPRouteIndexes()...) {
		b = b.WithIndex(ix.Object, ix.Field, ix.Extract)
	}
	return b.Build()
}

func watcher(s *sinks) *Watcher {
	return &Watcher{Table: table{s}, Throttle: throttles{s}, Pods: prober{s},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), workloads: map[target.Key]string{}}
}

var hello = target.Key{Namespace: "team", Name: "hello"}

func TestSyncBuildsTheTarget(t *testing.T) {
	p := pa("hello", "hello", 100)
	p.Spec.ContainerConcurrency = 4
	p.Spec.TimeoutSeconds = ptr.To(int32(42))
	p.Spec.Activator = &v1alpha1.ActivatorSpec{ColdStartHeader: ptr.To(false), QueueDepth: ptr.To(int32(50)),
		HealthChecks: &v1alpha1.HealthChecks{Paths: []v1alpha1.HealthCheckPath{"/healthz"}, UserAgents: []v1alpha1.HealthCheckUserAgent{"GoogleHC"}}}
	objs := []client.Object{
		p,
		service("hello", corev1.ServicePort{Name: "metrics", Port: 9090}, corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}),
		sks("hello", "hello", "activator-b", "activator-a"),
		private("hello", "hello"),
		// Two slices of the private Service: the port is found by the
		// public port's name; a terminating pod is left out, a pod not
		// ready yet is passed on for the prober to probe.
		slice("hello-private-1", "hello-private", map[string]int32{"http": 8080, "metrics": 9091},
			ep{ip: "10.244.1.7", ready: true}, ep{ip: "10.244.1.3", ready: false}, ep{ip: "10.244.1.9", ready: true, terminating: true}),
		slice("hello-private-2", "hello-private", map[string]int32{"http": 8080},
			ep{ip: "10.244.2.5", ready: true}),
		// The public Service's own slice and another target's are not its pods.
		slice("hello-abc", "hello", map[string]int32{"http": 8012}, ep{ip: "10.244.1.100", ready: true}),
		slice("other-private-1", "other-private", map[string]int32{"http": 8080}, ep{ip: "10.244.3.1", ready: true}),
	}
	s := newSinks()
	w := watcher(s)
	if err := w.Sync(context.Background(), reader(t, objs...), hello); err != nil {
		t.Fatal(err)
	}
	want := target.Target{Key: hello, ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Ports: []uint16{9090, 80},
		ContainerConcurrency: 4, Timeout: 42 * time.Second, QueueDepth: 50,
		HealthChecks: &target.HealthChecks{Paths: []string{"/healthz"}, UserAgents: []string{"GoogleHC"}, Status: 200}}
	if diff := cmp.Diff(want, s.targets[hello], cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("target (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(throttle.Settings{ContainerConcurrency: 4, Activators: []string{"activator-b", "activator-a"}, QueueDepth: 50}, s.settings[hello]); diff != "" {
		t.Errorf("throttle settings (-want +got):\n%s", diff)
	}
	wantPods := []readiness.Pod{
		{Addr: netip.MustParseAddrPort("10.244.1.3:8080"), Ready: false},
		{Addr: netip.MustParseAddrPort("10.244.1.7:8080"), Ready: true},
		{Addr: netip.MustParseAddrPort("10.244.2.5:8080"), Ready: true},
	}
	if diff := cmp.Diff(wantPods, s.pods[hello], cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
		t.Errorf("pods (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"throttle.Update", "table.Upsert", "pods.SetPods"}, s.order); diff != "" {
		t.Errorf("order (-want +got): the throttle must know a target before it resolves:\n%s", diff)
	}
	if name, ok := w.Workload(hello); !ok || name != "hello-deploy" {
		t.Errorf("Workload = %q, %v; want hello-deploy", name, ok)
	}
}

// TestPodsOnlyFromTheTargetsOwnPrivateService: a tenant names Services and
// labels slices as it likes; the activator takes as a target's pods only
// what Kubernetes computed for the private Service that the target's own
// ServerlessService controls. Any of these, taken as pods, would have the
// activators forward to themselves or to an address the tenant chose.
func TestPodsOnlyFromTheTargetsOwnPrivateService(t *testing.T) {
	good := slice("hello-private-1", "hello-private", map[string]int32{"http": 8080}, ep{ip: "10.244.1.7", ready: true})
	goodPods := []readiness.Pod{{Addr: netip.MustParseAddrPort("10.244.1.7:8080"), Ready: true}}
	// What sockscale writes for a public Service named "hello-private" in
	// Proxy mode: the activators, under that Service's name label.
	activatorSlice := slice("hello-private-sockscale-0", "hello-private", map[string]int32{"http": 8012}, ep{ip: "10.244.9.9", ready: true})
	activatorSlice.Labels[discoveryv1.LabelManagedBy] = "sockscale.dev"
	activatorSlice.OwnerReferences = sks("evil", "hello-private").OwnerReferences
	forgedLabel := slice("hello-private-forged", "hello-private", map[string]int32{"http": 8080}, ep{ip: "10.0.0.1", ready: true})
	forgedLabel.Labels[discoveryv1.LabelManagedBy] = "tenant"
	noOwner := slice("hello-private-orphan", "hello-private", map[string]int32{"http": 8080}, ep{ip: "10.0.0.2", ready: true})
	noOwner.OwnerReferences = nil
	// IPv6: an IPv6-only pod, a dual-stack one (one destination, its IPv4
	// address), and slices a tenant forged as the IPv4 ones above.
	good6 := slice("hello-private-6", "hello-private", map[string]int32{"http": 8080},
		ep{ip: "fd00:244::7", ready: true, pod: "hello-dual"}, ep{ip: "fd00:244::8", ready: true, pod: "hello-v6"})
	dual4 := slice("hello-private-4", "hello-private", map[string]int32{"http": 8080}, ep{ip: "10.244.1.7", ready: true, pod: "hello-dual"})
	forged6 := slice("hello-private-forged6", "hello-private", map[string]int32{"http": 8080}, ep{ip: "fd00:99::1", ready: true})
	forged6.Labels[discoveryv1.LabelManagedBy] = "tenant"
	noOwner6 := slice("hello-private-orphan6", "hello-private", map[string]int32{"http": 8080}, ep{ip: "fd00:99::2", ready: true})
	noOwner6.OwnerReferences = nil
	activatorSlice6 := slice("hello-private-sockscale-v6-0", "hello-private", map[string]int32{"http": 8012}, ep{ip: "fd00:9::9", ready: true})
	activatorSlice6.Labels[discoveryv1.LabelManagedBy] = "sockscale.dev"
	activatorSlice6.OwnerReferences = sks("evil", "hello-private").OwnerReferences
	notItsSKS := sks("hello", "hello", "activator-a")
	notItsSKS.OwnerReferences = nil
	notItsSKS.Status.Mode = v1alpha1.ModeProxy
	for _, tc := range []struct {
		name   string
		objs   []client.Object
		want   []readiness.Pod
		wantIn throttle.Settings
	}{
		{"the target's own chain", []client.Object{sks("hello", "hello", "activator-a"), private("hello", "hello"), good},
			goodPods, throttle.Settings{Activators: []string{"activator-a"}}},
		{"another target's public Service named like the private one, with activator slices",
			[]client.Object{sks("hello", "hello", "activator-a"), pa("evil", "hello-private", 1), service("hello-private", corev1.ServicePort{Port: 80}),
				sks("evil", "hello-private", "activator-a"), activatorSlice},
			nil, throttle.Settings{Activators: []string{"activator-a"}}},
		{"slices beside Kubernetes' own: a forged managed-by, no owner, sockscale's",
			[]client.Object{sks("hello", "hello", "activator-a"), private("hello", "hello"), good, forgedLabel, noOwner, activatorSlice},
			goodPods, throttle.Settings{Activators: []string{"activator-a"}}},
		{"a private Service of another ServerlessService", []client.Object{sks("hello", "hello", "activator-a"), private("evil", "hello"), good},
			nil, throttle.Settings{Activators: []string{"activator-a"}}},
		{"a ServerlessService the PodAutoscaler does not control", []client.Object{notItsSKS, private("hello", "hello"), good},
			nil, throttle.Settings{}},
		{"no ServerlessService yet", []client.Object{private("hello", "hello"), good}, nil, throttle.Settings{}},
		{"dual-stack and IPv6-only pods, beside forged IPv6 slices",
			[]client.Object{sks("hello", "hello", "activator-a"), private("hello", "hello"), dual4, good6, forged6, noOwner6, activatorSlice6},
			[]readiness.Pod{{Addr: netip.MustParseAddrPort("10.244.1.7:8080"), Ready: true}, {Addr: netip.MustParseAddrPort("[fd00:244::8]:8080"), Ready: true}},
			throttle.Settings{Activators: []string{"activator-a"}}},
		{"IPv6 pods of a private Service of another ServerlessService", []client.Object{sks("hello", "hello", "activator-a"), private("evil", "hello"), good6},
			nil, throttle.Settings{Activators: []string{"activator-a"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := append([]client.Object{pa("hello", "hello", 0), service("hello", corev1.ServicePort{Name: "http", Port: 80})}, tc.objs...)
			s := newSinks()
			if err := watcher(s).Sync(context.Background(), reader(t, objs...), hello); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, s.pods[hello], cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
				t.Errorf("pods (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantIn, s.settings[hello]); diff != "" {
				t.Errorf("throttle settings (-want +got):\n%s", diff)
			}
			if tc.wantIn.Activators == nil && s.targets[hello].Proxy {
				t.Error("a ServerlessService that is not the target's set its mode")
			}
		})
	}
}

func TestSyncRemoves(t *testing.T) {
	for _, tc := range []struct {
		name string
		objs []client.Object
	}{
		{"no PodAutoscaler names the Service", []client.Object{service("hello", corev1.ServicePort{Name: "http", Port: 80}), pa("other", "other", 1)}},
		{"the public Service is gone", []client.Object{pa("hello", "hello", 1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSinks()
			s.targets[hello] = target.Target{Key: hello}
			w := watcher(s)
			w.workloads[hello] = "hello"
			if err := w.Sync(context.Background(), reader(t, tc.objs...), hello); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]string{"table.Delete", "throttle.Delete", "pods.Delete"}, s.order); diff != "" {
				t.Errorf("order (-want +got): the table goes first, so no new request resolves:\n%s", diff)
			}
			if _, ok := w.Workload(hello); ok {
				t.Error("the workload is still known")
			}
		})
	}
}

func TestSyncOldestAutoscalerWins(t *testing.T) {
	newer, older := pa("newer", "hello", 200), pa("older", "hello", 100)
	newer.Spec.ContainerConcurrency, older.Spec.ContainerConcurrency = 9, 3
	s := newSinks()
	w := watcher(s)
	if err := w.Sync(context.Background(), reader(t, newer, older, service("hello", corev1.ServicePort{Port: 80})), hello); err != nil {
		t.Fatal(err)
	}
	if got := s.targets[hello].ContainerConcurrency; got != 3 {
		t.Errorf("containerConcurrency %d, want 3 (the older PodAutoscaler's)", got)
	}
}

// TestSyncH2C: a public Service port with appProtocol kubernetes.io/h2c
// makes the target h2c, and its pods are probed over h2c too.
func TestSyncH2C(t *testing.T) {
	h2c := "kubernetes.io/h2c"
	s := newSinks()
	w := watcher(s)
	objs := []client.Object{pa("hello", "hello", 1), service("hello", corev1.ServicePort{Name: "grpc", Port: 80, AppProtocol: &h2c}),
		sks("hello", "hello", "activator-a"), private("hello", "hello"),
		slice("hello-private-1", "hello-private", map[string]int32{"grpc": 9090}, ep{ip: "10.244.1.7", ready: false}, ep{ip: "10.244.1.8", ready: true})}
	if err := w.Sync(context.Background(), reader(t, objs...), hello); err != nil {
		t.Fatal(err)
	}
	if !s.targets[hello].H2C {
		t.Error("a port with appProtocol kubernetes.io/h2c did not make the target h2c")
	}
	wantPods := []readiness.Pod{
		{Addr: netip.MustParseAddrPort("10.244.1.7:9090"), H2C: true},
		{Addr: netip.MustParseAddrPort("10.244.1.8:9090"), Ready: true, H2C: true},
	}
	if diff := cmp.Diff(wantPods, s.pods[hello], cmpopts.EquateComparable(netip.AddrPort{})); diff != "" {
		t.Errorf("pods (-want +got):\n%s", diff)
	}
}

func ingress(name string, defaultBackend string, rules ...networkingv1.IngressRule) *networkingv1.Ingress {
	ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name}, Spec: networkingv1.IngressSpec{Rules: rules}}
	if defaultBackend != "" {
		ing.Spec.DefaultBackend = &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: defaultBackend, Port: networkingv1.ServiceBackendPort{Number: 80}}}
	}
	return ing
}

func rule(host string, services ...string) networkingv1.IngressRule {
	r := networkingv1.IngressRule{Host: host, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{}}}
	for _, s := range services {
		r.HTTP.Paths = append(r.HTTP.Paths, networkingv1.HTTPIngressPath{Path: "/" + s, PathType: ptr.To(networkingv1.PathTypePrefix),
			Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: s, Port: networkingv1.ServiceBackendPort{Number: 80}}}})
	}
	return r
}

// TestSyncIngressHosts: the hosts of Ingress rules whose backend is the
// public Service (and every host of an Ingress whose default backend it
// is) resolve to the target; wildcards and other Services' hosts do not.
func TestSyncIngressHosts(t *testing.T) {
	objs := []client.Object{
		pa("hello", "hello", 1), service("hello", corev1.ServicePort{Port: 80}),
		ingress("shop", "", rule("Shop.Example.com.", "hello", "cart"), rule("cart.example.com", "cart"), rule("*.example.com", "hello")),
		ingress("fallback", "hello", rule("www.example.com", "other")),
		ingress("unrelated", "", rule("other.example.com", "other")),
	}
	s := newSinks()
	if err := watcher(s).Sync(context.Background(), reader(t, objs...), hello); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"shop.example.com", "www.example.com"}, s.targets[hello].Hosts); diff != "" {
		t.Errorf("hosts (-want +got):\n%s", diff)
	}
}

func TestRouteBackends(t *testing.T) {
	u := newHTTPRoute()
	u.SetNamespace("team")
	u.Object["spec"] = map[string]any{
		"hostnames": []any{"shop.example.com", "*.shop.example.com"},
		"rules": []any{
			map[string]any{"backendRefs": []any{
				map[string]any{"name": "hello", "port": int64(80), "weight": int64(90)},
				map[string]any{"name": "canary", "kind": "Service", "group": ""},
				map[string]any{"name": "elsewhere", "namespace": "other"},
				map[string]any{"name": "bucket", "group": "storage.example.com", "kind": "Bucket"},
			}},
			map[string]any{"backendRefs": []any{map[string]any{"name": "hello", "namespace": "team"}}},
		},
	}
	want := map[string][]string{
		"hello":  {"shop.example.com", "*.shop.example.com", "shop.example.com", "*.shop.example.com"},
		"canary": {"shop.example.com", "*.shop.example.com"},
	}
	if diff := cmp.Diff(want, routeBackends(u)); diff != "" {
		t.Errorf("backends (-want +got): other namespaces and other kinds are left out:\n%s", diff)
	}
}
