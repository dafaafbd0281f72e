package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RouteSpec is a traffic split across Revisions, of any Services in the
// namespace: each target pins a revisionName or follows the latest ready
// Revision of the Service named by configurationName.
type RouteSpec struct {
	// Traffic: 1 to 100 targets whose percents sum to 100.
	//
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=100
	// +kubebuilder:validation:XValidation:rule="self.map(t, has(t.percent) ? t.percent : 0).sum() == 100",message="the traffic percents must sum to 100"
	// +kubebuilder:validation:XValidation:rule="self.all(t, has(t.revisionName) || has(t.configurationName))",message="each target of a Route names a revisionName or a configurationName (a Service whose latest ready Revision it follows)"
	// +kubebuilder:validation:XValidation:rule="self.all(t, !has(t.tag) || self.exists_one(u, has(u.tag) && u.tag == t.tag))",message="tags must be unique: two targets have the same tag"
	// +listType=atomic
	Traffic []TrafficTarget `json:"traffic"`
}

// RouteStatus is where the Route's traffic goes.
type RouteStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready, AllTrafficAssigned. Ready is Unknown with reason
	// RolloutInProgress during a gradual rollout.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	RouteStatusFields `json:",inline"`
}

// Route splits traffic across Revisions by percent and gives tagged
// targets their own addresses. A Service makes one of its own name; a
// Route may also stand alone.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ssrt,categories=sockscale
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name becomes a Kubernetes Service's name and a host name: a DNS-1035 label (lowercase letters, digits and '-', starting with a letter), at most 63 characters"
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=`.status.url`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Traffic",type=string,JSONPath=`.status.trafficSummary`
type Route struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   RouteSpec   `json:"spec"`
	Status RouteStatus `json:"status,omitempty"`
}

// RouteList is a list of Routes.
//
// +kubebuilder:object:root=true
type RouteList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Route `json:"items"`
}
