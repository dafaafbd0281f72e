package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ServiceSpec is Knative's: a template (each change makes a Revision) and
// a traffic split over the Service's Revisions.
type ServiceSpec struct {
	Template RevisionTemplateSpec `json:"template"`
	// Traffic splits new connections to the Service across its Revisions:
	// each target pins a revisionName or follows the latest ready Revision
	// (latestRevision: true, the default for a target without
	// revisionName). Unset or empty: 100 % to the latest ready Revision.
	// At most 100 targets.
	//
	// +kubebuilder:validation:MaxItems=100
	// +kubebuilder:validation:XValidation:rule="size(self) == 0 || self.map(t, has(t.percent) ? t.percent : 0).sum() == 100",message="the traffic percents must sum to 100"
	// +kubebuilder:validation:XValidation:rule="self.all(t, !has(t.configurationName))",message="configurationName is not allowed in a Service's traffic (its template is its configuration): use latestRevision: true"
	// +kubebuilder:validation:XValidation:rule="self.all(t, !has(t.tag) || self.exists_one(u, has(u.tag) && u.tag == t.tag))",message="tags must be unique: two targets have the same tag"
	// +listType=atomic
	// +optional
	Traffic []TrafficTarget `json:"traffic,omitempty"`
}

// ServiceStatus is the Revisions the Service made and where its traffic
// goes.
type ServiceStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready, ConfigurationsReady, RoutesReady. Ready is Unknown
	// with reason RolloutInProgress during a gradual rollout.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// LatestCreatedRevisionName is the Revision of the current template.
	// +optional
	LatestCreatedRevisionName string `json:"latestCreatedRevisionName,omitempty"`
	// LatestReadyRevisionName is the newest Revision that became ready:
	// what latestRevision: true targets get.
	// +optional
	LatestReadyRevisionName string `json:"latestReadyRevisionName,omitempty"`

	RouteStatusFields `json:",inline"`
}

// Service is Knative's Service on sockscale's autoscaler: every change of
// its template makes an immutable Revision, and its traffic is split across
// Revisions by percent (per connection, in the kernel, inside the cluster).
// A Knative Service manifest applies with its apiVersion changed.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ssvc,categories=sockscale
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name becomes a Kubernetes Service's name and a host name: a DNS-1035 label (lowercase letters, digits and '-', starting with a letter), at most 63 characters"
// +kubebuilder:validation:XValidation:rule="!has(self.spec.template.metadata) || !has(self.spec.template.metadata.name) || self.spec.template.metadata.name.startsWith(self.metadata.name + '-')",fieldPath=".spec.template.metadata.name",message="the template's name must start with the Service's name and a dash, e.g. <service>-v2"
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=`.status.url`
// +kubebuilder:printcolumn:name="LatestCreated",type=string,JSONPath=`.status.latestCreatedRevisionName`
// +kubebuilder:printcolumn:name="LatestReady",type=string,JSONPath=`.status.latestReadyRevisionName`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Traffic",type=string,JSONPath=`.status.trafficSummary`
type Service struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ServiceSpec   `json:"spec"`
	Status ServiceStatus `json:"status,omitempty"`
}

// ServiceList is a list of Services.
//
// +kubebuilder:object:root=true
type ServiceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Service `json:"items"`
}
