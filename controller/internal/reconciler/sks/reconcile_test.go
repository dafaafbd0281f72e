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
// the agents' node states and the public Service's addresses, on every
// path through Reconcile (here: not Ready, no endpoints), and is left out
// without a tracker.
func TestServerlessServiceSocketLayer(t *testing.T) {
	public := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	headless := public.DeepCopy()
	headless.Spec.ClusterIP, headless.Spec.ClusterIPs = corev1.ClusterIPNone, []string{corev1.ClusterIPNone}
	nodes := socketlayer.NewTracker(clock.RealClock{})
	nodes.Record(&stats.Batch{Node: "node-a", Period: time.Second, NodeState: &stats.NodeState{SocketRedirect: stats.RedirectActive}})
	tests := []struct {
		name       string
		svc        *corev1.Service
		tracker    *socketlayer.Tracker
		wantReason string // "" for no condition
	}{
		{"redirectable", public, nodes, socketlayer.ReasonInEffect},
		{"headless", headless, nodes, socketlayer.ReasonNotRedirectable},
		{"no public Service", nil, nodes, socketlayer.ReasonNotRedirectable},
		{"no tracker", public, nil, ""},
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
			c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&v1alpha1.ServerlessService{}).WithObjects(objs...).Build()
			r := &ServerlessService{Client: c, ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}), ActivatorPort: 8012, SocketLayer: tt.tracker}
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
