package owned

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
)

// EndpointSliceController is the managed-by label value of the slices
// Kubernetes computes from a Service's selector.
const EndpointSliceController = "endpointslice-controller.k8s.io"

// ServerlessService makes sks the PodAutoscaler's, as the controller
// does: a controller reference to pa (whose UID must be set: created, or
// given by the test). It returns sks.
func ServerlessService(sks *v1alpha1.ServerlessService, pa *v1alpha1.PodAutoscaler) *v1alpha1.ServerlessService {
	sks.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(pa, v1alpha1.GroupVersion.WithKind("PodAutoscaler"))}
	return sks
}

// PrivateService makes svc the ServerlessService's private Service, as
// the controller does. It returns svc.
func PrivateService(svc *corev1.Service, sks *v1alpha1.ServerlessService) *corev1.Service {
	svc.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(sks, v1alpha1.GroupVersion.WithKind("ServerlessService"))}
	return svc
}

// ComputedSlice makes s a slice Kubernetes' EndpointSlice controller
// computed for the Service svc: its labels and controller reference. It
// returns s.
func ComputedSlice(s *discoveryv1.EndpointSlice, svc *corev1.Service) *discoveryv1.EndpointSlice {
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	s.Labels[discoveryv1.LabelServiceName] = svc.Name
	s.Labels[discoveryv1.LabelManagedBy] = EndpointSliceController
	s.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(svc, corev1.SchemeGroupVersion.WithKind("Service"))}
	return s
}
