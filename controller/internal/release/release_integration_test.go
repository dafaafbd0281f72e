package release

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/sks"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationReleaseAndTakeBack runs TestReleaseAndTakeBack's story
// against a real kube-apiserver (Serve mode): the scale subresource of
// the controller's Deployment, the Service update, the slices' deletion,
// and on the take-back the uid-preconditioned delete of the Endpoints
// object Kubernetes left, which the mirroring controller would otherwise
// copy into slices again.
func TestIntegrationReleaseAndTakeBack(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c := cl.Client
	ctx := context.Background()
	target := map[string]string{"app": "hello"}
	labelsCtl := map[string]string{"app": "ctl"}
	objs := []client.Object{
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sockscale-controller"},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To(int32(2)), Selector: &metav1.LabelSelector{MatchLabels: labelsCtl},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labelsCtl},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "sockscale-controller"}}}}}},
		&v1alpha1.ServerlessService{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
			Spec: v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeServe, PublicService: "hello", Selector: target}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}},
		slice("hello-private-abc", "hello-private", "endpointslice-controller.k8s.io", "10.244.1.5"),
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	r := &sks.ServerlessService{Client: c, ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}), ActivatorPort: 8012}
	reconcile := func() {
		t.Helper()
		for range 2 {
			if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "hello"}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	reconcile()
	installed := publicState{SockscaleSlices: []string{"hello-sockscale-0=10.244.1.5"}}
	if diff := cmp.Diff(installed, state(t, c, "hello")); diff != "" {
		t.Fatalf("installed (-want +got):\n%s", diff)
	}

	ctl := types.NamespacedName{Namespace: "default", Name: "sockscale-controller"}
	res, err := Release(ctx, c, Options{Interval: 10 * time.Millisecond, Controller: &ctl})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Result{Services: 1, Slices: 1}, res); diff != "" {
		t.Errorf("Release (-want +got):\n%s", diff)
	}
	var d appsv1.Deployment
	if err := c.Get(ctx, ctl, &d); err != nil || *d.Spec.Replicas != 0 {
		t.Errorf("the controller's Deployment: replicas %v (%v); want 0", d.Spec.Replicas, err)
	}
	if diff := cmp.Diff(publicState{Selector: target, HandedBack: "hello"}, state(t, c, "hello")); diff != "" {
		t.Errorf("after Release (-want +got):\n%s", diff)
	}

	// What Kubernetes' Endpoints and mirroring controllers leave (they do
	// not run here): the Endpoints object, and its mirror once the
	// selector is gone.
	//nolint:staticcheck // deprecated, yet Kubernetes' Endpoints controller still writes it
	ep := &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello",
		Labels: map[string]string{"endpoints.kubernetes.io/managed-by": "endpoint-controller"}}}
	if err := c.Create(ctx, ep); err != nil {
		t.Fatal(err)
	}
	mirror := slice("hello-mirror", "hello", "endpointslicemirroring-controller.k8s.io", "10.244.1.5")
	mirror.Labels["endpoints.kubernetes.io/managed-by"] = "endpoint-controller"
	mirror.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Endpoints", Name: "hello", UID: ep.UID}}
	if err := c.Create(ctx, mirror); err != nil {
		t.Fatal(err)
	}

	reconcile()
	if diff := cmp.Diff(installed, state(t, c, "hello")); diff != "" {
		t.Errorf("installed again (-want +got):\n%s", diff)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(ep), ep); !apierrors.IsNotFound(err) {
		t.Errorf("the Endpoints object Kubernetes left: %v; want it deleted", err)
	}
	var left discoveryv1.EndpointSliceList
	if err := c.List(ctx, &left, client.InNamespace("default"), client.MatchingLabels{discoveryv1.LabelServiceName: "hello"}); err != nil {
		t.Fatal(err)
	}
	for _, s := range left.Items {
		if s.Labels[discoveryv1.LabelManagedBy] != sks.ManagedBy {
			t.Errorf("EndpointSlice %s of %s left after the take-back", s.Name, s.Labels[discoveryv1.LabelManagedBy])
		}
	}
}

// TestIntegrationReleaseOnlyManagedServices: through a real kube-apiserver,
// a ServerlessService that names a Service whose endpoints a user writes
// (an Endpoints object, mirrored by Kubernetes) never gets slices from the
// reconciler, and Release leaves that Service as it is while it hands back
// the one sockscale wrote.
func TestIntegrationReleaseOnlyManagedServices(t *testing.T) {
	cl := testenv.ControlPlane(t)
	c := cl.Client
	ctx := context.Background()
	svc := func(name string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	}
	sksOf := func(name string) *v1alpha1.ServerlessService {
		return &v1alpha1.ServerlessService{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec: v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeServe, PublicService: name, Selector: map[string]string{"app": name}}}
	}
	//nolint:staticcheck // deprecated, yet how a user writes a Service's endpoints by hand
	manual := &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "db"},
		Subsets: []corev1.EndpointSubset{{Addresses: []corev1.EndpointAddress{{IP: "192.0.2.7"}}, Ports: []corev1.EndpointPort{{Name: "http", Port: 5432}}}}}
	objs := []client.Object{
		sksOf("hello"), svc("hello"), slice("hello-private-abc", "hello-private", "endpointslice-controller.k8s.io", "10.244.1.5"),
		sksOf("db"), svc("db"), manual, slice("db-abc", "db", "endpointslicemirroring-controller.k8s.io", "192.0.2.7"),
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	r := &sks.ServerlessService{Client: c, ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}), ActivatorPort: 8012}
	for _, name := range []string{"hello", "db"} {
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(publicState{}, state(t, c, "db")); diff != "" {
		t.Fatalf("the user's Service before Release (-want +got):\n%s", diff)
	}

	res, err := Release(ctx, c, Options{Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Result{Services: 1, Slices: 1, Skipped: 1}, res); diff != "" {
		t.Errorf("Release (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(publicState{Selector: map[string]string{"app": "hello"}, HandedBack: "hello"}, state(t, c, "hello")); diff != "" {
		t.Errorf("sockscale's Service after Release (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(publicState{}, state(t, c, "db")); diff != "" {
		t.Errorf("the user's Service after Release (-want +got):\n%s", diff)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(manual), manual); err != nil {
		t.Errorf("the user's Endpoints: %v; want them left", err)
	}
}

// TestIntegrationReleaseFailureStartsTheControllerAgain: a release whose
// Service update the API server refuses (here: the controller's generated
// role without that verb) fails after it stopped the controller, and
// scales the controller back to its replicas, through the same role.
func TestIntegrationReleaseFailureStartsTheControllerAgain(t *testing.T) {
	cl := testenv.ControlPlane(t)
	ctx := context.Background()
	labelsCtl := map[string]string{"app": "ctl"}
	objs := []client.Object{
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sockscale-controller"},
			Spec: appsv1.DeploymentSpec{Replicas: ptr.To(int32(2)), Selector: &metav1.LabelSelector{MatchLabels: labelsCtl},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labelsCtl},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "sockscale-controller"}}}}}},
		&v1alpha1.ServerlessService{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
			Spec: v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeServe, PublicService: "hello", Selector: map[string]string{"app": "hello"}}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "hello"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}},
		slice("hello-private-abc", "hello-private", "endpointslice-controller.k8s.io", "10.244.1.5"),
	}
	for _, o := range objs {
		if err := cl.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	r := &sks.ServerlessService{Client: cl.Client, ActivatorSelector: labels.SelectorFromSet(labels.Set{"app": "activator"}), ActivatorPort: 8012}
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "default", Name: "hello"}}); err != nil {
		t.Fatal(err)
	}

	var rules []rbacv1.PolicyRule
	for _, rule := range testenv.GeneratedRules(t, "role.yaml") {
		if slices.Equal(rule.APIGroups, []string{""}) && slices.Equal(rule.Resources, []string{"services"}) {
			rule.Verbs = slices.DeleteFunc(slices.Clone(rule.Verbs), func(v string) bool { return v == "update" })
		}
		rules = append(rules, rule)
	}
	c, err := client.New(cl.ConfigAs(t, "release-without-service-update", rules), client.Options{Scheme: cl.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctl := types.NamespacedName{Namespace: "default", Name: "sockscale-controller"}
	_, err = Release(ctx, c, Options{Interval: 10 * time.Millisecond, Controller: &ctl})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("Release: %v; want the Service update refused", err)
	}
	var d appsv1.Deployment
	if err := cl.Client.Get(ctx, ctl, &d); err != nil {
		t.Fatal(err)
	}
	if *d.Spec.Replicas != 2 || d.Annotations[AnnotationReplicas] != "" {
		t.Errorf("the controller after the failed release: replicas %d, %s=%q; want 2 and none",
			*d.Spec.Replicas, AnnotationReplicas, d.Annotations[AnnotationReplicas])
	}
}
