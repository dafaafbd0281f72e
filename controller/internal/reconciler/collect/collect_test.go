package collect

import (
	"context"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/collector"
	"github.com/sockscale/sockscale/controller/internal/config"
)

var t0 = time.Unix(1_700_000_000, 0)

func scheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

func pa(name, deployment, service string) *v1alpha1.PodAutoscaler {
	return &v1alpha1.PodAutoscaler{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1alpha1.PodAutoscalerSpec{
			ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: deployment},
			Service:        v1alpha1.ServiceRef{Name: service},
		}}
}

// statefulSetPA scales a StatefulSet named like a Deployment: its events
// are not the Deployment's.
func statefulSetPA(name, target string) *v1alpha1.PodAutoscaler {
	p := pa(name, target, name)
	p.Spec.ScaleTargetRef.APIVersion, p.Spec.ScaleTargetRef.Kind = "apps/v1", "StatefulSet"
	return p
}

func deployment(name string, annotations map[string]string) *appsv1.Deployment {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: annotations}}}}
}

type ep struct {
	ip, node           string
	ready, terminating *bool
	pod                string // the targetRef's name; none if ""
}

func slice(name, service string, typ discoveryv1.AddressType, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: typ}
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.ip}, NodeName: ptr.To(e.node),
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Terminating: e.terminating}})
		if e.pod != "" {
			s.Endpoints[len(s.Endpoints)-1].TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: e.pod}
		}
	}
	return s
}

func TestReadyPods(t *testing.T) {
	c := fake.NewClientBuilder().WithObjects(
		slice("hello-private-1", "hello-private", discoveryv1.AddressTypeIPv4,
			ep{ip: "10.0.0.1", node: "node-a", ready: ptr.To(true)},
			ep{ip: "10.0.0.2", node: "node-b"}, // no condition: ready
			ep{ip: "10.0.0.3", node: "node-b", ready: ptr.To(false)},
			ep{ip: "10.0.0.4", node: "node-a", ready: ptr.To(false), terminating: ptr.To(true)}),
		slice("hello-private-2", "hello-private", discoveryv1.AddressTypeIPv4, ep{ip: "10.0.0.5", node: "node-c", ready: ptr.To(true)}),
		// Pod dual-1 is dual-stack: known by its IPv4 address only; pod
		// v6-1 is IPv6-only, and so is an endpoint that names no pod.
		slice("hello-private-3", "hello-private", discoveryv1.AddressTypeIPv4, ep{ip: "10.0.0.6", node: "node-c", ready: ptr.To(true), pod: "dual-1"}),
		slice("hello-private-6", "hello-private", discoveryv1.AddressTypeIPv6,
			ep{ip: "fd00::1", node: "node-a", ready: ptr.To(true), pod: "v6-1"},
			ep{ip: "fd00::6", node: "node-c", ready: ptr.To(true), pod: "dual-1"},
			ep{ip: "fd00::7", node: "node-c", ready: ptr.To(false), pod: "v6-2"},
			ep{ip: "fd00::8", node: "node-b", ready: ptr.To(true)}),
		slice("other-1", "other", discoveryv1.AddressTypeIPv4, ep{ip: "10.0.9.9", node: "node-a", ready: ptr.To(true)}),
	).Build()
	got, err := ReadyPods(context.Background(), c, "default", "hello-private")
	if err != nil {
		t.Fatal(err)
	}
	want := map[netip.Addr]string{
		netip.MustParseAddr("10.0.0.1"): "node-a", netip.MustParseAddr("10.0.0.2"): "node-b", netip.MustParseAddr("10.0.0.5"): "node-c",
		netip.MustParseAddr("10.0.0.6"): "node-c", netip.MustParseAddr("fd00::1"): "node-a", netip.MustParseAddr("fd00::8"): "node-b",
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	// Every pod, not ready and terminating too: the pods whose stats
	// their nodes' agents may send.
	_, all, err := Endpoints(context.Background(), c, "default", "hello-private")
	if err != nil {
		t.Fatal(err)
	}
	want[netip.MustParseAddr("10.0.0.3")] = "node-b"
	want[netip.MustParseAddr("10.0.0.4")] = "node-a"
	want[netip.MustParseAddr("fd00::7")] = "node-c"
	if diff := cmp.Diff(want, all, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("all endpoints (-want +got):\n%s", diff)
	}
}

// TestReconcileFeedsTheCollector: a PodAutoscaler's windows get the
// settings of its spec and annotations and expect its ready pods; a
// deleted one is forgotten.
func TestReconcileFeedsTheCollector(t *testing.T) {
	ctx := context.Background()
	hello := pa("hello", "hello-v1", "hello")
	c := fake.NewClientBuilder().WithScheme(scheme(t)).WithObjects(hello,
		deployment("hello-v1", map[string]string{config.AnnotationPrefix + "window": "10s"}),
		slice("hello-private-1", "hello-private", discoveryv1.AddressTypeIPv4,
			ep{ip: "10.0.0.1", node: "node-a", ready: ptr.To(true)}, ep{ip: "10.0.0.2", node: "node-b", ready: ptr.To(true)}),
	).Build()
	clk := clocktesting.NewFakeClock(t0)
	col := collector.New(clk)
	r := &Reconciler{Client: c, Collector: col, Config: config.Defaults}
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "hello"}}
	res, err := r.Reconcile(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if res.RequeueAfter != Resync {
		t.Errorf("requeue after %v, want %v (the ConfigMap is not watched)", res.RequeueAfter, Resync)
	}
	key := collector.Key{Namespace: "default", Name: "hello-v1"}
	v, err := col.Values(key, t0.Add(5*time.Second))
	if err != nil {
		t.Fatalf("the Deployment's windows do not exist: %v", err)
	}
	// Nobody reported: both ready pods are missing.
	if diff := cmp.Diff(collector.Values{Expected: 2, Missing: 2, MissingNodes: []string{"node-a", "node-b"}}, v); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}

	if err := c.Delete(ctx, hello); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := col.Values(key, t0); err == nil {
		t.Error("a deleted PodAutoscaler's windows are still kept")
	}
}

func TestEventsMapToPodAutoscalers(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientBuilder().WithScheme(scheme(t)).WithObjects(
		pa("a", "web", "front"), pa("b", "web", "back"), pa("c", "api", "api"), statefulSetPA("d", "web"),
	).WithIndex(&v1alpha1.PodAutoscaler{}, IndexDeployment, DeploymentIndex).
		WithIndex(&v1alpha1.PodAutoscaler{}, IndexPrivateService, PrivateServiceIndex).Build()
	r := &Reconciler{Client: c}
	names := func(reqs []reconcile.Request) []string {
		var out []string
		for _, q := range reqs {
			out = append(out, q.Name)
		}
		return out
	}
	if diff := cmp.Diff([]string{"a", "b"}, names(r.byDeployment(ctx, deployment("web", nil)))); diff != "" {
		t.Errorf("Deployment web (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"b"}, names(r.byPrivateService(ctx, slice("back-private-x", "back-private", discoveryv1.AddressTypeIPv4)))); diff != "" {
		t.Errorf("slice of back-private (-want +got):\n%s", diff)
	}
	if got := r.byPrivateService(ctx, slice("front-x", "front", discoveryv1.AddressTypeIPv4)); len(got) != 0 {
		t.Errorf("a public Service's slice maps to %v", names(got))
	}
}

// TestConfigChangeQueuesEveryPodAutoscaler: a new configuration in force
// (its windows' length, say) queues every PodAutoscaler, since the
// collect reconciler alone gives the collector their settings; the same
// configuration again queues nothing.
func TestConfigChangeQueuesEveryPodAutoscaler(t *testing.T) {
	c := fake.NewClientBuilder().WithScheme(scheme(t)).WithObjects(pa("a", "a", "a"), pa("b", "b", "b")).Build()
	var current atomic.Pointer[config.Config]
	current.Store(config.Defaults())
	r := &Reconciler{Client: c, Collector: collector.New(clocktesting.NewFakeClock(t0)), Config: current.Load}
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := r.configChanges(time.Millisecond).Start(ctx, q); err != nil {
		t.Fatal(err)
	}

	current.Store(config.Defaults()) // a new pointer, the same values
	time.Sleep(20 * time.Millisecond)
	if q.Len() != 0 {
		t.Fatalf("%d PodAutoscalers queued for an unchanged configuration, want 0", q.Len())
	}
	changed := config.Defaults()
	changed.StableWindow = 30 * time.Second
	current.Store(changed)
	deadline := time.Now().Add(5 * time.Second)
	for q.Len() < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	var got []string
	for q.Len() > 0 {
		req, _ := q.Get()
		got = append(got, req.Name)
		q.Done(req)
	}
	slices.Sort(got)
	if diff := cmp.Diff([]string{"a", "b"}, got); diff != "" {
		t.Errorf("queued after the change (-want +got):\n%s", diff)
	}
}
