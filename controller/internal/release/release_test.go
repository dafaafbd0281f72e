package release

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/sks"
)

var ready = true

func slice(name, service, manager string, ips ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: manager}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, ip := range ips {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	return s
}

// publicState is what a client of the Service depends on: its selector,
// sockscale's annotation, and the slices sockscale wrote for it.
type publicState struct {
	Selector        map[string]string
	HandedBack      string
	SockscaleSlices []string
}

func state(t *testing.T, c client.Client, name string) publicState {
	t.Helper()
	var svc corev1.Service
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: name}, &svc); err != nil {
		t.Fatal(err)
	}
	var list discoveryv1.EndpointSliceList
	if err := c.List(context.Background(), &list, client.MatchingLabels{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: sks.ManagedBy}); err != nil {
		t.Fatal(err)
	}
	st := publicState{Selector: svc.Spec.Selector, HandedBack: svc.Annotations[sks.AnnotationHandedBack]}
	for _, s := range list.Items {
		for _, e := range s.Endpoints {
			st.SockscaleSlices = append(st.SockscaleSlices, s.Name+"="+e.Addresses[0])
		}
	}
	return st
}

// TestReleaseAndTakeBack: the ServerlessService reconciler writes the
// public endpoints (here in Proxy mode: an activator); Release gives the
// Service its target's selector and removes sockscale's slices, and
// leaves a Service whose selector a user set as it is; a later install's
// reconciler removes the handed-back selector and writes the endpoints
// again.
func TestReleaseAndTakeBack(t *testing.T) {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	target := map[string]string{"app": "hello"}
	objs := []client.Object{
		&v1alpha1.ServerlessService{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello", UID: "sks-uid"},
			Spec:       v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeProxy, PublicService: "hello", Selector: target},
		},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}},
		// The private Service's slice, as Kubernetes writes it: one pod.
		slice("hello-private-abc", "hello-private", "endpointslice-controller.k8s.io", "10.244.1.5"),
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "activator-1", Labels: map[string]string{"app": "activator"}},
			Status: corev1.PodStatus{PodIP: "10.244.0.9", Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}},
		// A second ServerlessService whose Service a user gave a selector:
		// not sockscale's to change.
		&v1alpha1.ServerlessService{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "mine", UID: "sks-uid-2"},
			Spec:       v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeServe, PublicService: "mine", Selector: map[string]string{"app": "mine"}},
		},
		// The controller, scaled to zero first so it does not take back.
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "sockscale-system", Name: "sockscale-controller"},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To(int32(2))}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "mine"},
			Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "users-own"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}},
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&v1alpha1.ServerlessService{}).WithObjects(objs...).Build()
	r := &sks.ServerlessService{Client: c, ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}), ActivatorPort: 8012}
	reconcile := func() {
		t.Helper()
		for range 2 { // a take-back returns after its update; the next reconcile writes
			if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "hello"}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx := context.Background()

	reconcile()
	installed := publicState{SockscaleSlices: []string{"hello-sockscale-0=10.244.0.9"}}
	if diff := cmp.Diff(installed, state(t, c, "hello")); diff != "" {
		t.Fatalf("installed (-want +got):\n%s", diff)
	}

	ctl := types.NamespacedName{Namespace: "sockscale-system", Name: "sockscale-controller"}
	res, err := Release(ctx, c, Options{Interval: time.Millisecond, Controller: &ctl})
	if err != nil {
		t.Fatal(err)
	}
	var d appsv1.Deployment
	if err := c.Get(ctx, ctl, &d); err != nil || d.Spec.Replicas == nil || *d.Spec.Replicas != 0 {
		t.Errorf("the controller's Deployment after Release: replicas %v (%v); want 0", d.Spec.Replicas, err)
	}
	if diff := cmp.Diff(Result{Services: 1, Slices: 1}, res); diff != "" {
		t.Errorf("Release (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(publicState{Selector: target, HandedBack: "hello"}, state(t, c, "hello")); diff != "" {
		t.Errorf("after Release (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(publicState{Selector: map[string]string{"app": "users-own"}}, state(t, c, "mine")); diff != "" {
		t.Errorf("a user's selector after Release (-want +got):\n%s", diff)
	}
	// Twice is the same: nothing left to change.
	if res, err := Release(ctx, c, Options{Interval: time.Millisecond}); err != nil || res != (Result{}) {
		t.Errorf("second Release = %+v, %v; want nothing changed", res, err)
	}

	// Meanwhile Kubernetes listed the pods for the selector: a slice of
	// its EndpointSlice controller, and the Endpoints object of its
	// Endpoints controller, which its mirroring controller copies into
	// slices once the selector is gone again.
	//nolint:staticcheck // deprecated, yet Kubernetes' Endpoints controller still writes it
	ep := &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello", UID: "ep-uid",
		Labels: map[string]string{"endpoints.kubernetes.io/managed-by": "endpoint-controller"}}}
	mirror := slice("hello-mirror", "hello", "endpointslicemirroring-controller.k8s.io", "10.244.1.5")
	mirror.Labels["endpoints.kubernetes.io/managed-by"] = "endpoint-controller"
	mirror.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Endpoints", Name: "hello", UID: "ep-uid"}}
	for _, o := range []client.Object{ep, mirror, slice("hello-k8s", "hello", "endpointslice-controller.k8s.io", "10.244.1.5")} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	reconcile()
	if diff := cmp.Diff(installed, state(t, c, "hello")); diff != "" {
		t.Errorf("installed again (-want +got):\n%s", diff)
	}
	var left discoveryv1.EndpointSliceList
	if err := c.List(ctx, &left, client.MatchingLabels{discoveryv1.LabelServiceName: "hello"}); err != nil {
		t.Fatal(err)
	}
	for _, s := range left.Items {
		if s.Labels[discoveryv1.LabelManagedBy] != sks.ManagedBy {
			t.Errorf("EndpointSlice %s of %s left after the take-back", s.Name, s.Labels[discoveryv1.LabelManagedBy])
		}
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(ep), &corev1.Endpoints{}); !apierrors.IsNotFound(err) { //nolint:staticcheck // as above
		t.Errorf("the Endpoints object Kubernetes left: %v; want it deleted (or it is mirrored again)", err)
	}
}

func newScheme() *runtime.Scheme {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = v1alpha1.AddToScheme(scheme)
	return scheme
}

// controlledBy makes s controlled by the ServerlessService of uid.
func controlledBy(s *discoveryv1.EndpointSlice, uid types.UID) *discoveryv1.EndpointSlice {
	s.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "ServerlessService", Name: "x", UID: uid, Controller: ptr.To(true)}}
	return s
}

// TestReleaseOnlyWhatSockscaleManaged: a public Service without a
// selector gets its target's back only where sockscale shows it wrote
// the endpoints (a slice controlled by the ServerlessService, or its
// NoEndpoints condition); any other, such as one whose endpoints a user
// writes, is left as it is and counted as skipped, and so are slices that
// are not the ServerlessService's.
func TestReleaseOnlyWhatSockscaleManaged(t *testing.T) {
	target := map[string]string{"app": "hello"}
	mirrored := slice("hello-mirror", "hello", "endpointslicemirroring-controller.k8s.io", "192.0.2.7")
	tests := []struct {
		name       string
		cond       *metav1.Condition // the ServerlessService's Ready
		objs       []client.Object
		want       Result
		wantState  publicState
		wantSlices []string // every slice of Service hello left
	}{
		{"its slice", nil, []client.Object{controlledBy(slice("hello-sockscale-0", "hello", sks.ManagedBy, "10.244.1.5"), "sks-uid")},
			Result{Services: 1, Slices: 1}, publicState{Selector: target, HandedBack: "hello"}, nil},
		{"no endpoints written (NoEndpoints)", &metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: sks.ReasonNoEndpoints}, nil,
			Result{Services: 1}, publicState{Selector: target, HandedBack: "hello"}, nil},
		{"no slice", nil, nil, Result{Skipped: 1}, publicState{}, nil},
		{"refused: a user writes the endpoints", &metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "NotOwned"}, []client.Object{mirrored},
			Result{Skipped: 1}, publicState{}, []string{"hello-mirror"}},
		{"a slice only labelled as sockscale's", nil, []client.Object{slice("hello-sockscale-0", "hello", sks.ManagedBy, "10.244.1.5")},
			Result{Skipped: 1}, publicState{SockscaleSlices: []string{"hello-sockscale-0=10.244.1.5"}}, []string{"hello-sockscale-0"}},
		{"another ServerlessService's slice", nil, []client.Object{controlledBy(slice("hello-sockscale-0", "hello", sks.ManagedBy, "10.244.1.5"), "other-uid")},
			Result{Skipped: 1}, publicState{SockscaleSlices: []string{"hello-sockscale-0=10.244.1.5"}}, []string{"hello-sockscale-0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &v1alpha1.ServerlessService{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello", UID: "sks-uid"},
				Spec:       v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeServe, PublicService: "hello", Selector: target},
			}
			if tt.cond != nil {
				s.Status.Conditions = []metav1.Condition{*tt.cond}
			}
			objs := append([]client.Object{s, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
				Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}}, tt.objs...)
			c := fake.NewClientBuilder().WithScheme(newScheme()).WithStatusSubresource(&v1alpha1.ServerlessService{}).WithObjects(objs...).Build()
			res, err := Release(t.Context(), c, Options{Interval: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, res); diff != "" {
				t.Errorf("Release (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantState, state(t, c, "hello")); diff != "" {
				t.Errorf("the public Service (-want +got):\n%s", diff)
			}
			var left discoveryv1.EndpointSliceList
			if err := c.List(t.Context(), &left, client.MatchingLabels{discoveryv1.LabelServiceName: "hello"}); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range left.Items {
				got = append(got, s.Name)
			}
			if diff := cmp.Diff(tt.wantSlices, got); diff != "" {
				t.Errorf("EndpointSlices left (-want +got):\n%s", diff)
			}
		})
	}
}

// TestReleaseStartsTheControllerAgain: the controller is scaled to zero
// before the release, its replicas kept on its Deployment; a release that
// fails afterwards (a write refused, the Job's deadline) scales it back to
// them, also when a killed earlier attempt left it at zero.
func TestReleaseStartsTheControllerAgain(t *testing.T) {
	ctl := types.NamespacedName{Namespace: "sockscale-system", Name: "sockscale-controller"}
	refused := errors.New("refused")
	tests := []struct {
		name         string
		replicas     int32
		annotation   string // AnnotationReplicas left by an earlier attempt
		failServices bool   // Service updates are refused
		cancel       bool   // the context ends during the passes
		wantErr      bool
		wantReplicas int32
		wantAnnot    string
	}{
		{"released", 2, "", false, false, false, 0, "2"},
		{"a Service update refused", 2, "", true, false, true, 2, ""},
		{"the deadline", 2, "", false, true, true, 2, ""},
		{"a retry after a killed attempt", 0, "3", true, false, true, 3, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ctl.Namespace, Name: ctl.Name},
				Spec: appsv1.DeploymentSpec{Replicas: ptr.To(tt.replicas)}}
			if tt.annotation != "" {
				d.Annotations = map[string]string{AnnotationReplicas: tt.annotation}
			}
			objs := []client.Object{d,
				&v1alpha1.ServerlessService{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello", UID: "sks-uid"},
					Spec: v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeServe, PublicService: "hello", Selector: map[string]string{"app": "hello"}}},
				&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"}},
				controlledBy(slice("hello-sockscale-0", "hello", sks.ManagedBy, "10.244.1.5"), "sks-uid"),
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			c := fake.NewClientBuilder().WithScheme(newScheme()).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
				Update: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.UpdateOption) error {
					if _, ok := o.(*corev1.Service); ok && tt.failServices {
						return refused
					}
					return c.Update(ctx, o, opts...)
				},
				Delete: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.DeleteOption) error {
					if tt.cancel {
						cancel() // the first pass ends; the next one sees the deadline
					}
					return c.Delete(ctx, o, opts...)
				},
			}).Build()
			_, err := Release(ctx, c, Options{Interval: time.Millisecond, Controller: &ctl})
			if (err != nil) != tt.wantErr {
				t.Fatalf("Release: %v; want an error: %v", err, tt.wantErr)
			}
			var got appsv1.Deployment
			if err := c.Get(t.Context(), ctl, &got); err != nil {
				t.Fatal(err)
			}
			if *got.Spec.Replicas != tt.wantReplicas || got.Annotations[AnnotationReplicas] != tt.wantAnnot {
				t.Errorf("the controller: replicas %d, %s=%q; want %d, %q", *got.Spec.Replicas, AnnotationReplicas,
					got.Annotations[AnnotationReplicas], tt.wantReplicas, tt.wantAnnot)
			}
		})
	}
}
