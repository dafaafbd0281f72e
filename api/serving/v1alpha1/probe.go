package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Probe is a Kubernetes container probe whose port may be omitted, as in
// Knative: the controller fills in the serving container's port.
type Probe struct {
	ProbeHandler `json:",inline"`
	// +optional
	InitialDelaySeconds int32 `json:"initialDelaySeconds,omitempty"`
	// +optional
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`
	// PeriodSeconds; Knative's 0 means probe aggressively until ready.
	// +optional
	PeriodSeconds int32 `json:"periodSeconds,omitempty"`
	// +optional
	SuccessThreshold int32 `json:"successThreshold,omitempty"`
	// +optional
	FailureThreshold int32 `json:"failureThreshold,omitempty"`
	// +optional
	TerminationGracePeriodSeconds *int64 `json:"terminationGracePeriodSeconds,omitempty"`
}

// ProbeHandler is one of exec, httpGet, tcpSocket or grpc.
//
// +kubebuilder:validation:XValidation:rule="[has(self.exec), has(self.httpGet), has(self.tcpSocket), has(self.grpc)].filter(x, x).size() <= 1",message="a probe has at most one of exec, httpGet, tcpSocket or grpc"
type ProbeHandler struct {
	// +optional
	Exec *corev1.ExecAction `json:"exec,omitempty"`
	// +optional
	HTTPGet *HTTPGetAction `json:"httpGet,omitempty"`
	// +optional
	TCPSocket *TCPSocketAction `json:"tcpSocket,omitempty"`
	// +optional
	GRPC *GRPCAction `json:"grpc,omitempty"`
}

// HTTPGetAction is corev1.HTTPGetAction with an optional port.
type HTTPGetAction struct {
	// +optional
	Path string `json:"path,omitempty"`
	// Port: unset means the serving container's port.
	// +optional
	Port *intstr.IntOrString `json:"port,omitempty"`
	// +optional
	Host string `json:"host,omitempty"`
	// +optional
	Scheme corev1.URIScheme `json:"scheme,omitempty"`
	// +listType=atomic
	// +optional
	HTTPHeaders []corev1.HTTPHeader `json:"httpHeaders,omitempty"`
}

// TCPSocketAction is corev1.TCPSocketAction with an optional port.
type TCPSocketAction struct {
	// Port: unset means the serving container's port.
	// +optional
	Port *intstr.IntOrString `json:"port,omitempty"`
	// +optional
	Host string `json:"host,omitempty"`
}

// GRPCAction is corev1.GRPCAction with an optional port.
type GRPCAction struct {
	// Port: unset or 0 means the serving container's port.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`
	// +optional
	Service *string `json:"service,omitempty"`
}
