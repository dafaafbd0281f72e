package sks

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/names"
	"github.com/sockscale/sockscale/controller/internal/socketlayer"
	"github.com/sockscale/sockscale/internal/stats"
)

// TestServerlessServiceRefusesForeignObjects: objects sockscale does not
// own are reported in the Ready condition and left as they are.
func TestServerlessServiceRefusesForeignObjects(t *testing.T) {
	sks := func() *v1alpha1.ServerlessService {
		return &v1alpha1.ServerlessService{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello", UID: "sks-uid"},
			Spec:       v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeServe, PublicService: "hello", Selector: map[string]string{"app": "hello"}},
		}
	}
	public := func(selector map[string]string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
			Spec: corev1.ServiceSpec{Selector: selector, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	}
	tests := []struct {
		name       string
		objs       []client.Object
		wantReason string
		wantInMsg  string
	}{
		{"no public Service", nil, ReasonPublicServiceNotFound, `Service "hello" does not exist`},
		{"public Service with a selector", []client.Object{public(map[string]string{"app": "hello"})}, ReasonPublicServiceHasSelector, "remove spec.selector"},
		{"a foreign private Service", []client.Object{public(nil), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello-private"}}},
			names.ReasonNotOwned, `Service "hello-private" exists and is not managed`},
		{"a foreign EndpointSlice of the public Service", []client.Object{public(nil), &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "hello-manual", Labels: map[string]string{discoveryv1.LabelServiceName: "hello", discoveryv1.LabelManagedBy: "someone"}},
			AddressType: discoveryv1.AddressTypeIPv4,
		}}, names.ReasonNotOwned, `EndpointSlice "hello-manual" of Service "hello" is managed by "someone"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			_ = clientgoscheme.AddToScheme(scheme)
			_ = v1alpha1.AddToScheme(scheme)
			c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&v1alpha1.ServerlessService{}).
				WithObjects(append(tt.objs, sks())...).Build()
			r := &ServerlessService{Client: c, ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}), ActivatorPort: 8012}
			if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "hello"}}); err != nil {
				t.Fatal(err)
			}
			var got v1alpha1.ServerlessService
			if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "hello"}, &got); err != nil {
				t.Fatal(err)
			}
			cond := meta.FindStatusCondition(got.Status.Conditions, names.ConditionReady)
			if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != tt.wantReason || !strings.Contains(cond.Message, tt.wantInMsg) {
				t.Errorf("Ready = %+v, want False %s with %q", cond, tt.wantReason, tt.wantInMsg)
			}
			// Foreign objects are untouched.
			for _, o := range tt.objs {
				fresh := o.DeepCopyObject().(client.Object)
				if err := c.Get(context.Background(), client.ObjectKeyFromObject(o), fresh); err != nil {
					t.Errorf("%s was removed: %v", o.GetName(), err)
				} else if len(fresh.GetOwnerReferences()) > 0 {
					t.Errorf("%s was taken over: %v", o.GetName(), fresh.GetOwnerReferences())
				}
			}
		})
	}
}

// TestServerlessServiceSocketLayer: the SocketLayer condition comes from
// the agents' node states, the public Service's addresses and the
// activators' families, on every path through Reconcile (here: not
// Ready, no endpoints; Proxy with an activator), and is left out without
// a tracker.
func TestServerlessServiceSocketLayer(t *testing.T) {
	public := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	headless := public.DeepCopy()
	headless.Spec.ClusterIP, headless.Spec.ClusterIPs = corev1.ClusterIPNone, []string{corev1.ClusterIPNone}
	dual := public.DeepCopy()
	dual.Spec.ClusterIPs, dual.Spec.IPFamilies = []string{"10.96.0.10", "fd00:96::a"}, []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	activator := func(ips ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "sockscale-system", Name: "activator-0", Labels: map[string]string{"app": "activator"}},
			Status: corev1.PodStatus{PodIP: ips[0], Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
		for _, ip := range ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		return p
	}
	nodes := socketlayer.NewTracker(clock.RealClock{})
	nodes.Record(&stats.Batch{Node: "node-a", Period: time.Second, NodeState: &stats.NodeState{SocketRedirect: stats.RedirectActive}})
	tests := []struct {
		name       string
		svc        *corev1.Service
		activator  *corev1.Pod
		tracker    *socketlayer.Tracker
		wantReason string // "" for no condition
	}{
		{"redirectable", public, nil, nodes, socketlayer.ReasonInEffect},
		{"headless", headless, nil, nodes, socketlayer.ReasonNotRedirectable},
		{"no public Service", nil, nil, nodes, socketlayer.ReasonNotRedirectable},
		{"no tracker", public, nil, nil, ""},
		{"dual-stack, a dual-stack activator", dual, activator("10.0.2.10", "fd00:2::10"), nodes, socketlayer.ReasonInEffect},
		{"dual-stack, an IPv4-only activator", dual, activator("10.0.2.10"), nodes, socketlayer.ReasonNoActivatorOfFamily},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			_ = clientgoscheme.AddToScheme(scheme)
			_ = v1alpha1.AddToScheme(scheme)
			objs := []client.Object{&v1alpha1.ServerlessService{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello", UID: "sks-uid"},
				Spec:       v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeServe, PublicService: "hello", Port: 80, Selector: map[string]string{"app": "hello"}},
			}}
			if tt.svc != nil {
				objs = append(objs, tt.svc)
			}
			if tt.activator != nil {
				objs = append(objs, tt.activator)
			}
			c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&v1alpha1.ServerlessService{}).WithObjects(objs...).Build()
			r := &ServerlessService{Client: c, ActivatorNamespace: "sockscale-system", ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}), ActivatorPort: 8012, SocketLayer: tt.tracker}
			if _, err := r.Reconcile(t.Context(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "hello"}}); err != nil {
				t.Fatal(err)
			}
			var got v1alpha1.ServerlessService
			if err := c.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "hello"}, &got); err != nil {
				t.Fatal(err)
			}
			cond := meta.FindStatusCondition(got.Status.Conditions, socketlayer.ConditionType)
			switch {
			case tt.wantReason == "" && cond != nil:
				t.Errorf("SocketLayer = %+v without a tracker, want none", cond)
			case tt.wantReason != "" && (cond == nil || cond.Reason != tt.wantReason):
				t.Errorf("SocketLayer = %+v, want reason %s", cond, tt.wantReason)
			}
		})
	}
}

// TestEventsMapToServerlessServices: a Service or EndpointSlice event
// maps, through the IndexService index, to the ServerlessServices whose
// public or private Service it concerns.
func TestEventsMapToServerlessServices(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	sks := func(name, public string) *v1alpha1.ServerlessService {
		return &v1alpha1.ServerlessService{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Spec: v1alpha1.ServerlessServiceSpec{PublicService: public}}
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(sks("a", "web"), sks("b", "api")).
		WithIndex(&v1alpha1.ServerlessService{}, IndexService, ServiceIndex).Build()
	r := &ServerlessService{Client: c}
	for service, want := range map[string][]reconcile.Request{
		"web":                           {{NamespacedName: types.NamespacedName{Namespace: "default", Name: "a"}}},
		names.PrivateServiceName("api"): {{NamespacedName: types.NamespacedName{Namespace: "default", Name: "b"}}},
		"other":                         {},
	} {
		got := r.byServiceName(context.Background(), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: service}})
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Service %s (-want +got):\n%s", service, diff)
		}
	}
}

// TestServerlessServiceDeletesOwnSlicesOfAGoneService: once the public
// Service is gone or has a selector, the slices this ServerlessService
// wrote for it are deleted (they would outlive the Service, or sit beside
// Kubernetes' own); slices that only carry sockscale's label, or belong to
// another ServerlessService or to Kubernetes, are left.
func TestServerlessServiceDeletesOwnSlicesOfAGoneService(t *testing.T) {
	slice := func(name, manager string, owner types.UID) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{
				discoveryv1.LabelServiceName: "hello", discoveryv1.LabelManagedBy: manager}},
			AddressType: discoveryv1.AddressTypeIPv4,
		}
		if owner != "" {
			s.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ServerlessService",
				Name: "x", UID: owner, Controller: ptr.To(true)}}
		}
		return s
	}
	public := func(selector map[string]string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
			Spec: corev1.ServiceSpec{Selector: selector, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	}
	tests := []struct {
		name       string
		svc        *corev1.Service
		wantReason string
		wantInMsg  string
	}{
		{"no public Service", nil, ReasonPublicServiceNotFound, "keeps no EndpointSlices for it meanwhile (those it wrote are deleted)"},
		{"a user's selector", public(map[string]string{"app": "users-own"}), ReasonPublicServiceHasSelector, "sockscale's EndpointSlices of it are deleted"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			_ = clientgoscheme.AddToScheme(scheme)
			_ = v1alpha1.AddToScheme(scheme)
			objs := []client.Object{
				&v1alpha1.ServerlessService{
					ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello", UID: "sks-uid"},
					Spec:       v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeServe, PublicService: "hello", Selector: map[string]string{"app": "hello"}},
				},
				slice("hello-sockscale-0", ManagedBy, "sks-uid"),
				slice("hello-sockscale-1", ManagedBy, "sks-uid"),
				slice("hello-forged", ManagedBy, ""),
				slice("hello-other-sks", ManagedBy, "other-uid"),
				slice("hello-k8s", "endpointslice-controller.k8s.io", ""),
			}
			if tt.svc != nil {
				objs = append(objs, tt.svc)
			}
			c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&v1alpha1.ServerlessService{}).WithObjects(objs...).Build()
			r := &ServerlessService{Client: c, ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}), ActivatorPort: 8012}
			if _, err := r.Reconcile(t.Context(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "hello"}}); err != nil {
				t.Fatal(err)
			}
			var left discoveryv1.EndpointSliceList
			if err := c.List(t.Context(), &left); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range left.Items {
				got = append(got, s.Name)
			}
			if diff := cmp.Diff([]string{"hello-forged", "hello-k8s", "hello-other-sks"}, got); diff != "" {
				t.Errorf("EndpointSlices left (-want +got):\n%s", diff)
			}
			var sks v1alpha1.ServerlessService
			if err := c.Get(t.Context(), client.ObjectKey{Namespace: "default", Name: "hello"}, &sks); err != nil {
				t.Fatal(err)
			}
			cond := meta.FindStatusCondition(sks.Status.Conditions, names.ConditionReady)
			if cond == nil || cond.Reason != tt.wantReason || !strings.Contains(cond.Message, tt.wantInMsg) {
				t.Errorf("Ready = %+v, want %s with %q", cond, tt.wantReason, tt.wantInMsg)
			}
		})
	}
}

// TestServerlessServiceKeepsContainerConcurrencyWithoutActivators: with no
// activator ready, a target in Proxy for its containerConcurrency gets no
// public endpoint rather than its pods (where nothing would hold them to
// the limit), and its Ready condition says why; a target without one is
// put on its pods.
func TestServerlessServiceKeepsContainerConcurrencyWithoutActivators(t *testing.T) {
	for _, tt := range []struct {
		name       string
		reason     string
		wantMode   v1alpha1.Mode
		wantPods   bool
		wantStatus metav1.ConditionStatus
	}{
		{"containerConcurrency", "ContainerConcurrency", v1alpha1.ModeProxy, false, metav1.ConditionFalse},
		{"no burst capacity", "NoBurstCapacity", v1alpha1.ModeServe, true, metav1.ConditionTrue},
	} {
		t.Run(tt.name, func(t *testing.T) {
			sks := &v1alpha1.ServerlessService{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello", UID: "sks-uid"},
				Spec: v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeProxy, ModeReason: tt.reason, PublicService: "hello",
					Selector: map[string]string{"app": "hello"}, Port: 80, NumActivators: 1},
			}
			public := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
				Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
			pods := &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "hello-private-abc", Labels: map[string]string{discoveryv1.LabelServiceName: "hello-private"}},
				AddressType: discoveryv1.AddressTypeIPv4,
				Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.7"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
			}
			scheme := runtime.NewScheme()
			_ = clientgoscheme.AddToScheme(scheme)
			_ = v1alpha1.AddToScheme(scheme)
			c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&v1alpha1.ServerlessService{}).
				WithObjects(sks, public, pods).Build()
			r := &ServerlessService{Client: c, ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}), ActivatorPort: 8012}
			if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "hello"}}); err != nil {
				t.Fatal(err)
			}
			var got v1alpha1.ServerlessService
			if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "hello"}, &got); err != nil {
				t.Fatal(err)
			}
			cond := meta.FindStatusCondition(got.Status.Conditions, names.ConditionReady)
			if got.Status.Mode != tt.wantMode || got.Status.ModeReason != "NoActivatorEndpoints" || cond == nil || cond.Status != tt.wantStatus {
				t.Fatalf("status: mode %s reason %s, Ready %+v; want %s NoActivatorEndpoints, Ready %s", got.Status.Mode, got.Status.ModeReason, cond, tt.wantMode, tt.wantStatus)
			}
			if tt.wantStatus == metav1.ConditionFalse && !strings.Contains(cond.Message, "containerConcurrency") {
				t.Errorf("Ready message %q does not say why", cond.Message)
			}
			var slices discoveryv1.EndpointSliceList
			if err := c.List(context.Background(), &slices, client.MatchingLabels{discoveryv1.LabelServiceName: "hello"}); err != nil {
				t.Fatal(err)
			}
			var addrs []string
			for _, s := range slices.Items {
				for _, e := range s.Endpoints {
					addrs = append(addrs, e.Addresses...)
				}
			}
			if onPods := len(addrs) == 1 && addrs[0] == "10.244.1.7"; onPods != tt.wantPods || (!tt.wantPods && len(addrs) > 0) {
				t.Errorf("public endpoints %v; want the pod: %v", addrs, tt.wantPods)
			}
		})
	}
}
