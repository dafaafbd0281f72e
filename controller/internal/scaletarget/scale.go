package scaletarget

import (
	"context"
	"fmt"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// scaleGVK is what every /scale subresource serves.
var scaleGVK = autoscalingv1.SchemeGroupVersion.WithKind("Scale")

// Get reads the /scale of namespace/name of kind gvk. It is a GET to the
// API server, never the cache: subresources are not cached, and caching
// each kind a PodAutoscaler may name would watch all of its objects in
// the cluster. The object is handled as unstructured, so any kind the API
// server serves works without a Go type; the client's REST mapper turns
// the kind into its resource.
func Get(ctx context.Context, c client.Client, gvk schema.GroupVersionKind, namespace, name string) (*autoscalingv1.Scale, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(scaleGVK)
	if err := c.SubResource("scale").Get(ctx, object(gvk, namespace, name), u); err != nil {
		return nil, err
	}
	sc := &autoscalingv1.Scale{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, sc); err != nil {
		return nil, fmt.Errorf("read the /scale of %s %s/%s: %w", gvk.Kind, namespace, name, err)
	}
	return sc, nil
}

// Update writes sc (read by Get, its spec.replicas changed) back to the
// /scale of kind gvk. Its resourceVersion is the one read: a change made
// in between is a conflict, not overwritten.
func Update(ctx context.Context, c client.Client, gvk schema.GroupVersionKind, sc *autoscalingv1.Scale) error {
	body, err := runtime.DefaultUnstructuredConverter.ToUnstructured(sc)
	if err != nil {
		return fmt.Errorf("write the /scale of %s %s/%s: %w", gvk.Kind, sc.Namespace, sc.Name, err)
	}
	u := &unstructured.Unstructured{Object: body}
	u.SetGroupVersionKind(scaleGVK)
	return c.SubResource("scale").Update(ctx, object(gvk, sc.Namespace, sc.Name), client.WithSubResourceBody(u))
}

func object(gvk schema.GroupVersionKind, namespace, name string) *unstructured.Unstructured {
	o := &unstructured.Unstructured{}
	o.SetGroupVersionKind(gvk)
	o.SetNamespace(namespace)
	o.SetName(name)
	return o
}

// HasScale says whether the API server serves a /scale subresource for
// kind gvk, from its discovery document: the 404 of a missing object and
// that of a kind without /scale cannot be told apart otherwise (and
// reading the object itself would need a right on it the controller
// does not have).
func HasScale(d discovery.DiscoveryInterface, mapper meta.RESTMapper, gvk schema.GroupVersionKind) (bool, error) {
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return false, fmt.Errorf("map %s to its resource: %w", gvk, err)
	}
	list, err := d.ServerResourcesForGroupVersion(gvk.GroupVersion().String())
	if err != nil {
		return false, fmt.Errorf("discover the resources of %s: %w", gvk.GroupVersion(), err)
	}
	for _, r := range list.APIResources {
		if r.Name == m.Resource.Resource+"/scale" {
			return true, nil
		}
	}
	return false, nil
}
