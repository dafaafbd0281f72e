package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ServerlessServiceSpec is what the controller wants for a target's
// Services. The PodAutoscaler of the same name writes it every tick.
type ServerlessServiceSpec struct {
	// Mode wanted: Serve (public endpoints are the pods) or Proxy
	// (activators). The forced cases (no ready pod, no activator) are
	// applied on top and show in status.
	Mode Mode `json:"mode"`
	// ModeReason says why the autoscaler wants Mode: Serving;
	// ScaledToZero, NoBurstCapacity or ContainerConcurrency (the
	// activators keep each pod within its containerConcurrency) for
	// Proxy. It becomes the Ready condition's reason unless a forced case
	// applies.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	ModeReason string `json:"modeReason,omitempty"`
	// NumActivators to put in the path in Proxy mode.
	// +kubebuilder:validation:Minimum=0
	// +optional
	NumActivators int32 `json:"numActivators,omitempty"`
	// PublicService is the Service clients call (it must have no
	// selector: its EndpointSlices are written here).
	// +kubebuilder:validation:MinLength=1
	PublicService string `json:"publicService"`
	// Port is the public Service's port the target serves (the
	// PodAutoscaler's spec.service.port): in Proxy mode only it goes to
	// the activators, and the Service's other ports keep going to the
	// pods. 0: every port goes to the activators.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`
	// Selector selects the target's pods; the private Service
	// <publicService>-private gets it.
	// +kubebuilder:validation:MinProperties=1
	Selector map[string]string `json:"selector"`
}

// ServerlessServiceStatus is what is in place.
type ServerlessServiceStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	Mode Mode `json:"mode,omitempty"`
	// ModeReason says why Mode: the spec's reason, or a forced case
	// (NoReadyPods: Proxy while no pod is ready; NoActivatorEndpoints:
	// Serve while no activator is, or, for a target in Proxy for its
	// containerConcurrency, Proxy with no endpoint).
	// +optional
	ModeReason string `json:"modeReason,omitempty"`
	// Activators in the public endpoints.
	// +optional
	Activators []string `json:"activators,omitempty"`
	// ServiceName is the public Service; PrivateServiceName selects the pods.
	// +optional
	ServiceName string `json:"serviceName,omitempty"`
	// +optional
	PrivateServiceName string `json:"privateServiceName,omitempty"`
	// Conditions: Ready (the public endpoints are in place) and
	// SocketLayer (whether the nodes' agents also switch the target in
	// the kernel, at connect time; the message names nodes where not).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ServerlessService is made by the controller for each PodAutoscaler: it
// owns the public Service's endpoints and switches them between the pods
// and the activators.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=sks,categories=sockscale
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.status.mode`
// +kubebuilder:printcolumn:name="Activators",type=string,JSONPath=`.status.activators`
// +kubebuilder:printcolumn:name="Service",type=string,JSONPath=`.status.serviceName`
// +kubebuilder:printcolumn:name="Private",type=string,JSONPath=`.status.privateServiceName`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="SocketLayer",type=string,JSONPath=`.status.conditions[?(@.type=="SocketLayer")].status`,description="True: every reporting node's agent switches the target's new connects in the kernel; False or Unknown: see the SocketLayer condition's message for the nodes where only the EndpointSlices (kube-proxy) switch it"
type ServerlessService struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ServerlessServiceSpec   `json:"spec"`
	Status ServerlessServiceStatus `json:"status,omitempty"`
}

// ServerlessServiceList is a list of ServerlessServices.
//
// +kubebuilder:object:root=true
type ServerlessServiceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ServerlessService `json:"items"`
}
