package cachetrim

import (
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/reconciler/kpa"
	"github.com/sockscale/sockscale/controller/internal/reconciler/sks"
)

// Why trim, and why not filter by label: a PodAutoscaler names any
// Deployment and Service of its namespace, which carry no sockscale label,
// so the controller watches every Deployment and EndpointSlice in the
// cluster (a selector cannot say "the ones some PodAutoscaler names").
// What it reads of them is small: of a Deployment, its replicas, selector,
// progress deadline, pod template annotations and status; of an
// EndpointSlice it did not write and that is not a private Service's,
// only that it exists and who manages it (the ServerlessService reconciler
// deletes or names such slices on a public Service). The pod template's
// spec and the slice's endpoints are most of each object's bytes, so they
// are dropped as the object enters the cache. Knative's autoscaler does
// the same for its scale targets by reading them through a duck type that
// holds only the fields it scales with.
//
// A trimmed object must never be written back whole: nothing in the
// controller updates a Deployment or EndpointSlice it does not control
// (the Revision reconciler checks control before it corrects a
// Deployment, and the ServerlessService reconciler only deletes foreign
// slices), and the objects it does control are kept whole. Services are
// cached whole for that reason: the ServerlessService reconciler updates
// the user's public Service (its selector, on hand-back) from the cache.

// Options are the controller manager's cache options: managed fields
// dropped from every object, Pods limited to the activators (the only
// pods any reconciler reads), HorizontalPodAutoscalers to those the HPA
// class makes, and Deployments and EndpointSlices trimmed as Deployment
// and EndpointSlice say.
func Options(activators labels.Selector) cache.Options {
	return cache.Options{
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}: {Label: activators},
			&autoscalingv2.HorizontalPodAutoscaler{}: {Label: labels.SelectorFromSet(nil).Add(
				must(labels.NewRequirement(kpa.LabelPodAutoscaler, selection.Exists, nil)))},
			&appsv1.Deployment{}:         {Transform: Deployment},
			&discoveryv1.EndpointSlice{}: {Transform: EndpointSlice},
		},
		DefaultTransform: cache.TransformStripManagedFields(),
	}
}

// must returns r, or panics on an error of a requirement built from
// constants.
func must(r *labels.Requirement, err error) labels.Requirement {
	if err != nil {
		panic(err)
	}
	return *r
}

// stripManagedFields is the default transform, which an object's own
// Transform replaces and so must apply itself.
var stripManagedFields = cache.TransformStripManagedFields()

// Deployment is the cache transform of Deployments. One controlled by a
// sockscale Revision is kept whole (its reconciler compares and corrects
// the pod template); any other keeps its metadata without annotations,
// spec.replicas, .selector, .progressDeadlineSeconds, .paused and the pod
// template's labels and annotations (where the autoscaling annotations
// are), and its status.
func Deployment(in any) (any, error) {
	in, _ = stripManagedFields(in)
	d, ok := in.(*appsv1.Deployment)
	if !ok || controlledByRevision(d) {
		return in, nil
	}
	d.Annotations = nil // kubectl's last-applied-configuration alone is a copy of the object
	d.Spec = appsv1.DeploymentSpec{
		Replicas:                d.Spec.Replicas,
		Selector:                d.Spec.Selector,
		ProgressDeadlineSeconds: d.Spec.ProgressDeadlineSeconds,
		Paused:                  d.Spec.Paused,
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{
			Labels: d.Spec.Template.Labels, Annotations: d.Spec.Template.Annotations,
		}},
	}
	return d, nil
}

// controlledByRevision: d's controller is a sockscale Revision (of any
// version of the serving API).
func controlledByRevision(d *appsv1.Deployment) bool {
	ref := metav1.GetControllerOfNoCopy(d)
	if ref == nil || ref.Kind != "Revision" {
		return false
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	return err == nil && gv.Group == servingv1alpha1.GroupVersion.Group
}

// EndpointSlice is the cache transform of EndpointSlices. Those the
// controller reads the endpoints of are kept whole: the ones it writes
// (a public Service's, a Route's: managed by sks.ManagedBy) and a private
// Service's (Kubernetes copies the Service's sks.LabelServerlessService
// label onto its slices). Any other keeps its metadata without
// annotations, its address type and ports, and no endpoints.
func EndpointSlice(in any) (any, error) {
	in, _ = stripManagedFields(in)
	s, ok := in.(*discoveryv1.EndpointSlice)
	if !ok || s.Labels[discoveryv1.LabelManagedBy] == sks.ManagedBy {
		return in, nil
	}
	if _, private := s.Labels[sks.LabelServerlessService]; private {
		return in, nil
	}
	s.Annotations = nil
	s.Endpoints = nil
	return s, nil
}

var _ toolscache.TransformFunc = Deployment
var _ toolscache.TransformFunc = EndpointSlice
