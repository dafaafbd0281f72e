package watch

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/sockscale/sockscale/activator/internal/resolve"
	"github.com/sockscale/sockscale/activator/internal/target"
	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
)

// routeService is a Service the controller writes for Route route (tag ""
// for its own address).
func routeService(name, route, tag string) *corev1.Service {
	svc := service(name, corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP})
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs = "10.96.1.1", []string{"10.96.1.1"}
	svc.Labels = map[string]string{servingv1alpha1.RouteLabelKey: route}
	if tag != "" {
		svc.Labels[servingv1alpha1.TagLabelKey] = tag
	}
	return svc
}

func route(name string, traffic ...servingv1alpha1.TrafficTargetStatus) *servingv1alpha1.Route {
	r := &servingv1alpha1.Route{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name}}
	r.Status.Traffic = traffic
	return r
}

// TestSyncRouteService: a Service labelled with a Route that no
// PodAutoscaler names is the Route's address (or a tag's) in the table,
// with its ClusterIP, TCP ports and Ingress hosts; one that a
// PodAutoscaler names stays a target.
func TestSyncRouteService(t *testing.T) {
	tagSvc := routeService("latest-hello", "hello", "latest")
	tagSvc.Spec.Ports = append(tagSvc.Spec.Ports, corev1.ServicePort{Name: "udp", Port: 53, Protocol: corev1.ProtocolUDP})
	objs := []client.Object{
		routeService("hello", "hello", ""), tagSvc,
		ingress("shop", "", rule("shop.example.com", "hello")),
		// A revision's public Service with a Route label by mistake.
		pa("hello-00001", "hello-00001", 1), routeService("hello-00001", "hello", ""),
	}
	r := reader(t, objs...)
	s := newSinks()
	w := watcher(s)
	w.workloads[target.Key{Namespace: "team", Name: "hello"}] = "was a target"
	for _, name := range []string{"hello", "latest-hello", "hello-00001"} {
		if err := w.Sync(context.Background(), r, target.Key{Namespace: "team", Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	ip := []netip.Addr{netip.MustParseAddr("10.96.1.1")}
	want := map[target.Key]resolve.RouteService{
		{Namespace: "team", Name: "hello"}:        {Key: target.Key{Namespace: "team", Name: "hello"}, Route: "hello", ClusterIPs: ip, Ports: []uint16{80}, Hosts: []string{"shop.example.com"}},
		{Namespace: "team", Name: "latest-hello"}: {Key: target.Key{Namespace: "team", Name: "latest-hello"}, Route: "hello", Tag: "latest", ClusterIPs: ip, Ports: []uint16{80}},
	}
	if diff := cmp.Diff(want, s.services, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("route Services (-want +got):\n%s", diff)
	}
	if _, ok := s.targets[target.Key{Namespace: "team", Name: "hello-00001"}]; !ok {
		t.Error("a Service a PodAutoscaler names is not a target")
	}
	if diff := cmp.Diff([]string{"table.UpsertRouteService", "throttle.Delete", "pods.Delete"}, s.order[:3]); diff != "" {
		t.Errorf("order (-want +got): the table's entry is replaced first, then what a target had goes:\n%s", diff)
	}
	if _, ok := w.Workload(target.Key{Namespace: "team", Name: "hello"}); ok {
		t.Error("a Route's Service kept a target's workload")
	}

	// The label goes: no longer the Route's; the Service goes: gone.
	plain := service("latest-hello", corev1.ServicePort{Port: 80})
	r = reader(t, plain)
	for _, name := range []string{"latest-hello", "hello"} {
		if err := w.Sync(context.Background(), r, target.Key{Namespace: "team", Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	if len(s.services) != 0 {
		t.Errorf("route Services left: %v", s.services)
	}
}

// TestSyncRoute: a Route's status.traffic is the table's split (an unset
// percent is 0); a deleted Route leaves the table.
func TestSyncRoute(t *testing.T) {
	p := func(v int64) *int64 { return &v }
	r := reader(t, route("hello",
		servingv1alpha1.TrafficTargetStatus{RevisionName: "hello-00001", Percent: p(60)},
		servingv1alpha1.TrafficTargetStatus{RevisionName: "hello-00002", Percent: p(40), Tag: "latest"},
		servingv1alpha1.TrafficTargetStatus{RevisionName: "hello-00003", Tag: "old"},
	), route("empty"))
	s := newSinks()
	w := watcher(s)
	for _, name := range []string{"hello", "empty"} {
		if err := w.SyncRoute(context.Background(), r, target.Key{Namespace: "team", Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	want := map[target.Key]resolve.Route{
		{Namespace: "team", Name: "hello"}: {Key: target.Key{Namespace: "team", Name: "hello"}, Traffic: []resolve.Traffic{
			{Revision: "hello-00001", Percent: 60}, {Revision: "hello-00002", Percent: 40, Tag: "latest"}, {Revision: "hello-00003", Tag: "old"}}},
		{Namespace: "team", Name: "empty"}: {Key: target.Key{Namespace: "team", Name: "empty"}},
	}
	if diff := cmp.Diff(want, s.routes); diff != "" {
		t.Errorf("routes (-want +got):\n%s", diff)
	}
	if err := w.SyncRoute(context.Background(), reader(t), target.Key{Namespace: "team", Name: "hello"}); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.routes[target.Key{Namespace: "team", Name: "hello"}]; ok {
		t.Error("a deleted Route stays in the table")
	}
}

// TestSyncProxyMode: a target is Proxy when its ServerlessService's status
// (not its spec) says so; Serve only when its spec and status both say
// Serve and it is Ready (its public endpoints are its ready pods).
func TestSyncProxyMode(t *testing.T) {
	ready := func(st metav1.ConditionStatus) []metav1.Condition {
		return []metav1.Condition{{Type: "Ready", Status: st, Reason: "R", LastTransitionTime: metav1.Now()}}
	}
	for _, tc := range []struct {
		name         string
		spec, status v1alpha1.Mode
		conditions   []metav1.Condition
		proxy, serve bool
	}{
		{"proxy", v1alpha1.ModeProxy, v1alpha1.ModeProxy, ready(metav1.ConditionTrue), true, false},
		{"proxy wanting serve", v1alpha1.ModeServe, v1alpha1.ModeProxy, ready(metav1.ConditionTrue), true, false},
		{"serve", v1alpha1.ModeServe, v1alpha1.ModeServe, ready(metav1.ConditionTrue), false, true},
		{"serve not ready", v1alpha1.ModeServe, v1alpha1.ModeServe, ready(metav1.ConditionFalse), false, false},
		{"serve no condition", v1alpha1.ModeServe, v1alpha1.ModeServe, nil, false, false},
		{"serve forced, proxy wanted", v1alpha1.ModeProxy, v1alpha1.ModeServe, ready(metav1.ConditionTrue), false, false},
		{"no status", v1alpha1.ModeServe, "", nil, false, false},
	} {
		sk := sks("hello", "hello", "activator-a")
		sk.Spec.Mode = tc.spec
		sk.Status.Mode = tc.status
		sk.Status.Conditions = tc.conditions
		s := newSinks()
		if err := watcher(s).Sync(context.Background(), reader(t, pa("hello", "hello", 1), service("hello", corev1.ServicePort{Port: 80}), sk), hello); err != nil {
			t.Fatal(err)
		}
		if got := s.targets[hello]; got.Proxy != tc.proxy || got.Serve != tc.serve {
			t.Errorf("%s: Proxy %v, Serve %v; want %v, %v", tc.name, got.Proxy, got.Serve, tc.proxy, tc.serve)
		}
	}
}

// TestRoutesUnreadable: a missing CRD and an RBAC refusal are told apart
// and named, so the one log line says what to fix.
func TestRoutesUnreadable(t *testing.T) {
	gr := schema.GroupResource{Group: servingv1alpha1.GroupVersion.Group, Resource: "routes"}
	for _, tc := range []struct {
		name string
		err  error
		want string // substring; "" for readable
	}{
		{"readable", nil, ""},
		{"no CRD", &meta.NoKindMatchError{GroupKind: schema.GroupKind{Group: gr.Group, Kind: "Route"}}, "the serving API is not installed (no routes.serving.sockscale.dev/v1alpha1)"},
		{"no CRD, stale discovery", apierrors.NewNotFound(gr, ""), "the serving API is not installed"},
		{"RBAC", apierrors.NewForbidden(gr, "", errors.New("no rule")), "RBAC forbids listing routes.serving.sockscale.dev (the activator's ClusterRole needs get, list and watch on them)"},
		{"other", errors.New("connection refused"), "list routes.serving.sockscale.dev: connection refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := interceptor.NewClient(fake.NewClientBuilder().WithScheme(scheme(t)).Build(), interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, l client.ObjectList, o ...client.ListOption) error {
				if tc.err != nil {
					return tc.err
				}
				return c.List(ctx, l, o...)
			}})
			w := watcher(newSinks())
			w.APIReader = c
			got := w.routesUnreadable(context.Background())
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("routesUnreadable = %q, want %q", got, tc.want)
			}
		})
	}
}
