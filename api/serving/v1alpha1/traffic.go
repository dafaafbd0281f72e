package v1alpha1

// TrafficTarget is one entry of a traffic split in a spec, in Knative's
// shape: it names what gets the traffic.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.revisionName) && has(self.latestRevision) && self.latestRevision)",message="sets both revisionName and latestRevision: true; a target names exactly one"
// +kubebuilder:validation:XValidation:rule="has(self.revisionName) || !has(self.latestRevision) || self.latestRevision",message="has latestRevision: false and no revisionName; a target names exactly one of revisionName or latestRevision: true (configurationName in a Route)"
// +kubebuilder:validation:XValidation:rule="!(has(self.revisionName) && has(self.configurationName))",message="sets both revisionName and configurationName; a target names exactly one"
type TrafficTarget struct {
	// Tag gives the target its own address, <tag>-<route>.<namespace>...,
	// whatever its percent. A DNS label; unique within a split.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	Tag string `json:"tag,omitempty"`
	// RevisionName pins the target to one Revision.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	RevisionName string `json:"revisionName,omitempty"`
	// ConfigurationName (Routes only) follows the latest ready Revision of
	// the Service of this name: in sockscale a Service is its own
	// configuration.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	ConfigurationName string `json:"configurationName,omitempty"`
	// LatestRevision true follows the latest ready Revision (of the
	// Service itself, or of configurationName in a Route); false pins
	// revisionName. Unset: true when revisionName is unset (Knative's
	// default).
	// +optional
	LatestRevision *bool `json:"latestRevision,omitempty"`
	// Percent of new connections this target gets, 0 to 100; unset
	// means 0. The percents of a split sum to 100.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	Percent *int64 `json:"percent,omitempty"`
}

// TrafficTargetStatus is one entry of the split in effect: the Revision
// resolved (latestRevision true says it was the latest when resolved) and
// the tag's URL.
type TrafficTargetStatus struct {
	// +optional
	Tag string `json:"tag,omitempty"`
	// +optional
	RevisionName string `json:"revisionName,omitempty"`
	// +optional
	ConfigurationName string `json:"configurationName,omitempty"`
	// +optional
	LatestRevision *bool `json:"latestRevision,omitempty"`
	// +optional
	Percent *int64 `json:"percent,omitempty"`
	// URL is the tag's own address.
	// +optional
	URL string `json:"url,omitempty"`
}

// Addressable is where a Service or Route is reached inside the cluster.
type Addressable struct {
	// +optional
	Name string `json:"name,omitempty"`
	// URL, e.g. http://hello.default.svc.cluster.local.
	// +optional
	URL string `json:"url,omitempty"`
}

// RouteStatusFields is the part of a status that says where the traffic
// goes; a Service's status has it too.
type RouteStatusFields struct {
	// URL is the external address, or the cluster-local one when there is
	// none.
	// +optional
	URL string `json:"url,omitempty"`
	// +optional
	Address *Addressable `json:"address,omitempty"`
	// Traffic is the split in effect (during a gradual rollout, the
	// current step), each target with its Revision resolved.
	// +listType=atomic
	// +optional
	Traffic []TrafficTargetStatus `json:"traffic,omitempty"`
	// TrafficSummary is the split in effect in one line, for kubectl get
	// (its columns show one element of a list): each revision with a
	// share and its percent, e.g. "hello-00002=55%,hello-00001=45%".
	// +optional
	TrafficSummary string `json:"trafficSummary,omitempty"`
}
