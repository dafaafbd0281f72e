package cachetrim

import (
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/controller/internal/reconciler/sks"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

// TestIntegrationTheCacheKeepsWhatTheControllerReads: through the real API
// server and a cache with the controller's Options, objects sockscale does
// not control arrive trimmed, its own whole, and only activator pods are
// cached.
func TestIntegrationTheCacheKeepsWhatTheControllerReads(t *testing.T) {
	cl := testenv.ControlPlane(t)
	ctx := t.Context()
	create := func(o client.Object) {
		t.Helper()
		o.SetResourceVersion("")
		o.SetUID("")
		if err := cl.Client.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
	create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop"}})
	user := userDeployment("cart")
	user.Status = appsv1.DeploymentStatus{}
	create(user)
	owned := revisionControlled(userDeployment("hello-00001-deployment"), "serving.sockscale.dev/v1alpha1", true)
	owned.Status = appsv1.DeploymentStatus{}
	create(owned)
	foreign := userSlice("cart", 100)
	create(foreign)
	private := userSlice("hello-private", 100)
	private.Labels[sks.LabelServerlessService] = "hello"
	create(private)
	for _, p := range []*corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "activator", Labels: map[string]string{"app": "activator"}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "app", Labels: map[string]string{"app": "cart"}}},
	} {
		p.Spec.Containers = []corev1.Container{{Name: "c", Image: "registry.example/c"}}
		create(p)
	}

	c, err := cache.New(cl.Config, func() cache.Options {
		o := Options(labels.SelectorFromSet(labels.Set{"app": "activator"}))
		o.Scheme = cl.Client.Scheme()
		return o
	}())
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	get := func(name string, o client.Object) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, "the cache has "+name, func() (bool, string) {
			err := c.Get(ctx, client.ObjectKey{Namespace: "shop", Name: name}, o)
			return err == nil, fmt.Sprint(err)
		})
	}

	var d appsv1.Deployment
	get("cart", &d)
	if len(d.Spec.Template.Spec.Containers) != 0 || d.Annotations != nil || d.ManagedFields != nil {
		t.Errorf("a user's Deployment kept %d containers, annotations %v, %d managed fields", len(d.Spec.Template.Spec.Containers), d.Annotations != nil, len(d.ManagedFields))
	}
	if *d.Spec.Replicas != 3 || d.Spec.Selector.MatchLabels["app"] != "cart" || d.Spec.Template.Annotations["autoscaling.knative.dev/target"] != "20" {
		t.Errorf("a user's Deployment lost what the controller reads: replicas %d, selector %v, template annotations %v", *d.Spec.Replicas, d.Spec.Selector, d.Spec.Template.Annotations)
	}
	get(owned.Name, &d)
	if len(d.Spec.Template.Spec.Containers) != 3 || d.ManagedFields != nil {
		t.Errorf("a Revision's Deployment: %d containers (want 3), %d managed fields", len(d.Spec.Template.Spec.Containers), len(d.ManagedFields))
	}
	var s discoveryv1.EndpointSlice
	get(foreign.Name, &s)
	if len(s.Endpoints) != 0 || s.Labels[discoveryv1.LabelManagedBy] != foreign.Labels[discoveryv1.LabelManagedBy] {
		t.Errorf("a foreign slice: %d endpoints (want none), managed by %q", len(s.Endpoints), s.Labels[discoveryv1.LabelManagedBy])
	}
	get(private.Name, &s)
	if len(s.Endpoints) != 100 {
		t.Errorf("a private Service's slice: %d endpoints, want 100", len(s.Endpoints))
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods); err != nil || len(pods.Items) != 1 || pods.Items[0].Name != "activator" {
		t.Errorf("cached pods: %v (err %v), want only the activator", podNames(pods.Items), err)
	}
}

func podNames(pods []corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}
