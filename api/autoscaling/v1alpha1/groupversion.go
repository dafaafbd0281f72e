package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is sockscale.dev/v1alpha1.
	GroupVersion = schema.GroupVersion{Group: "sockscale.dev", Version: "v1alpha1"}

	// SchemeBuilder registers the types with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&PodAutoscaler{}, &PodAutoscalerList{},
		&ServerlessService{}, &ServerlessServiceList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
