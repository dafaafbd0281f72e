package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Bounds of a Revision's request settings: Knative's defaults for
// container-concurrency-max-limit and max-revision-timeout-seconds.
const (
	// MaxContainerConcurrency is the largest containerConcurrency accepted.
	MaxContainerConcurrency = 1000
	// MaxTimeoutSeconds is the largest timeoutSeconds accepted.
	MaxTimeoutSeconds = 600
)

// Labels the controller puts on what it makes for a Service.
const (
	// ServiceLabelKey names the Service a Revision or Route belongs to.
	ServiceLabelKey = "serving.sockscale.dev/service"
	// RevisionLabelKey names the Revision a Deployment, PodAutoscaler or
	// pod belongs to.
	RevisionLabelKey = "serving.sockscale.dev/revision"
	// RouteLabelKey names the Route a Kubernetes Service (its own address
	// or a tag's) belongs to. Agents and activators find a Route's
	// addresses by it.
	RouteLabelKey = "serving.sockscale.dev/route"
	// TagLabelKey is on a tag's Kubernetes Service, <tag>-<route>: the
	// tag of the Route's status.traffic whose Revision it reaches. The
	// Route's own address has no tag label.
	TagLabelKey = "serving.sockscale.dev/tag"
)

// RolloutDurationAnnotation on a Service or Route overrides the
// cluster's rollout-duration for it (Knative's key, so manifests keep
// it): a Go duration or whole seconds, e.g. "60s" or "60".
const RolloutDurationAnnotation = "serving.knative.dev/rollout-duration"

// Container is the part of a Kubernetes container that a Revision may set:
// Knative's allowed fields, with the same names and shapes. Name may be
// omitted, as in Knative (the controller names it user-container).
//
// What no setting of the cluster allows a Revision's container (the rest
// of securityContext the controller checks against the autoscaler
// ConfigMap's pod-spec keys; docs/configuration.md, "Pod-spec fields"):
//
// +kubebuilder:validation:XValidation:rule="!has(self.securityContext) || !has(self.securityContext.privileged) || !self.securityContext.privileged",fieldPath=".securityContext.privileged",message="a Revision's containers may not be privileged"
// +kubebuilder:validation:XValidation:rule="!has(self.securityContext) || !has(self.securityContext.procMount) || self.securityContext.procMount == 'Default'",fieldPath=".securityContext.procMount",message="a Revision's containers may only have procMount Default"
// +kubebuilder:validation:XValidation:rule="!has(self.securityContext) || !has(self.securityContext.windowsOptions) || !has(self.securityContext.windowsOptions.hostProcess) || !self.securityContext.windowsOptions.hostProcess",fieldPath=".securityContext.windowsOptions.hostProcess",message="a Revision's containers may not be host processes"
type Container struct {
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Name string `json:"name,omitempty"`
	// +kubebuilder:validation:MinLength=1
	Image string `json:"image"`
	// +optional
	Command []string `json:"command,omitempty"`
	// +optional
	Args []string `json:"args,omitempty"`
	// +optional
	WorkingDir string `json:"workingDir,omitempty"`
	// Ports: at most one, the port the container serves on (Knative's
	// rule); unset means 8080.
	// +kubebuilder:validation:MaxItems=1
	// +listType=atomic
	// +optional
	Ports []corev1.ContainerPort `json:"ports,omitempty"`
	// +optional
	EnvFrom []corev1.EnvFromSource `json:"envFrom,omitempty"`
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
	// +optional
	VolumeMounts []corev1.VolumeMount `json:"volumeMounts,omitempty"`
	// +optional
	LivenessProbe *Probe `json:"livenessProbe,omitempty"`
	// +optional
	ReadinessProbe *Probe `json:"readinessProbe,omitempty"`
	// +optional
	StartupProbe *Probe `json:"startupProbe,omitempty"`
	// +optional
	TerminationMessagePath string `json:"terminationMessagePath,omitempty"`
	// +optional
	TerminationMessagePolicy corev1.TerminationMessagePolicy `json:"terminationMessagePolicy,omitempty"`
	// +optional
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`
	// +optional
	SecurityContext *corev1.SecurityContext `json:"securityContext,omitempty"`
}

// RevisionSpec is what one immutable version of a Service runs: the pod
// spec fields Knative allows (inline, as in Knative) and the request
// settings the activator and the autoscaler apply.
//
// +kubebuilder:validation:XValidation:rule="size(self.containers) <= 1 || self.containers.exists_one(c, has(c.ports) && size(c.ports) > 0)",fieldPath=".containers",message="with several containers, exactly one must set ports: the one that serves requests"
// +kubebuilder:validation:XValidation:rule="!has(self.securityContext) || !has(self.securityContext.windowsOptions) || !has(self.securityContext.windowsOptions.hostProcess) || !self.securityContext.windowsOptions.hostProcess",fieldPath=".securityContext.windowsOptions.hostProcess",message="a Revision's pods may not be host processes"
// +kubebuilder:validation:XValidation:rule="!has(self.responseStartTimeoutSeconds) || !has(self.timeoutSeconds) || self.responseStartTimeoutSeconds <= self.timeoutSeconds",fieldPath=".responseStartTimeoutSeconds",message="responseStartTimeoutSeconds must not exceed timeoutSeconds"
type RevisionSpec struct {
	// Containers: at least one; with several, exactly the one that sets
	// ports serves requests.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=10
	// +listType=atomic
	Containers []Container `json:"containers"`
	// Volumes: configMap, secret, projected, downwardAPI, and, when the
	// autoscaler ConfigMap's key allows them, emptyDir (allowed by
	// default), hostPath and persistentVolumeClaim. No other kind.
	// +kubebuilder:validation:MaxItems=100
	// +kubebuilder:validation:items:XValidation:rule="has(self.configMap) || has(self.secret) || has(self.projected) || has(self.downwardAPI) || has(self.emptyDir) || has(self.hostPath) || has(self.persistentVolumeClaim)",message="a Revision's volume must be configMap, secret, projected, downwardAPI, emptyDir, hostPath or persistentVolumeClaim (the last three also need their key in the autoscaler ConfigMap)"
	// +optional
	Volumes []corev1.Volume `json:"volumes,omitempty"`
	// +optional
	ServiceAccountName string `json:"serviceAccountName,omitempty"`
	// +optional
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`
	// +optional
	EnableServiceLinks *bool `json:"enableServiceLinks,omitempty"`
	// +optional
	AutomountServiceAccountToken *bool `json:"automountServiceAccountToken,omitempty"`
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// +optional
	SecurityContext *corev1.PodSecurityContext `json:"securityContext,omitempty"`

	// ContainerConcurrency is the hard limit of requests one pod gets at
	// once; 0 or unset means no limit. At most 1000 (Knative's default
	// container-concurrency-max-limit).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +optional
	ContainerConcurrency *int64 `json:"containerConcurrency,omitempty"`
	// TimeoutSeconds bounds one request from its arrival to its last
	// response byte: 1 to 600 (Knative's default
	// max-revision-timeout-seconds); unset means 300.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=600
	// +optional
	TimeoutSeconds *int64 `json:"timeoutSeconds,omitempty"`
	// ResponseStartTimeoutSeconds bounds the wait for the first response
	// byte (at most timeoutSeconds). Stored for Knative compatibility; the
	// activator does not apply it yet.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=600
	// +optional
	ResponseStartTimeoutSeconds *int64 `json:"responseStartTimeoutSeconds,omitempty"`
	// IdleTimeoutSeconds bounds the time between two response bytes.
	// Stored for Knative compatibility; the activator does not apply it
	// yet.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=600
	// +optional
	IdleTimeoutSeconds *int64 `json:"idleTimeoutSeconds,omitempty"`
}

// RevisionTemplateMetadata is the metadata a template may set (Knative
// allows these three): the Revision's name and the labels and annotations
// that the Revision, its Deployment's pods and its PodAutoscaler carry.
//
// +kubebuilder:validation:XValidation:rule="!has(self.annotations) || !('autoscaling.knative.dev/class' in self.annotations) || self.annotations['autoscaling.knative.dev/class'] in ['kpa.autoscaling.knative.dev', 'hpa.autoscaling.knative.dev', 'external.autoscaling.sockscale.dev']",fieldPath=".annotations",message="autoscaling.knative.dev/class must be kpa.autoscaling.knative.dev, hpa.autoscaling.knative.dev or external.autoscaling.sockscale.dev"
// +kubebuilder:validation:XValidation:rule="!has(self.annotations) || ['autoscaling.knative.dev/min-scale', 'autoscaling.knative.dev/max-scale', 'autoscaling.knative.dev/initial-scale'].all(k, !(k in self.annotations) || self.annotations[k].matches('^[0-9]{1,9}$'))",fieldPath=".annotations",message="autoscaling.knative.dev/min-scale, max-scale and initial-scale must be non-negative integers"
// +kubebuilder:validation:XValidation:rule="!has(self.annotations) || !('autoscaling.knative.dev/metric' in self.annotations) || self.annotations['autoscaling.knative.dev/metric'] in ['concurrency', 'rps'] || (self.annotations['autoscaling.knative.dev/metric'] in ['cpu', 'memory'] && 'autoscaling.knative.dev/class' in self.annotations && self.annotations['autoscaling.knative.dev/class'] == 'hpa.autoscaling.knative.dev')",fieldPath=".annotations",message="autoscaling.knative.dev/metric must be concurrency or rps, or cpu or memory with autoscaling.knative.dev/class hpa.autoscaling.knative.dev"
type RevisionTemplateMetadata struct {
	// Name of the Revision this template makes; it must start with the
	// Service's name and a dash. Unset: <service>-00001, -00002, ...
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	Name string `json:"name,omitempty"`
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// Annotations, among them autoscaling.knative.dev/* (the PodAutoscaler's
	// keys: docs/autoscaling.md, "Per-target settings").
	// +kubebuilder:validation:MaxProperties=64
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// RevisionTemplateSpec is a Service's template: every change of it makes a
// new Revision.
type RevisionTemplateSpec struct {
	// +optional
	Metadata RevisionTemplateMetadata `json:"metadata,omitempty"`
	Spec     RevisionSpec             `json:"spec"`
}

// ContainerStatus is the image digest a Revision's container resolved to.
type ContainerStatus struct {
	// +optional
	Name string `json:"name,omitempty"`
	// +optional
	ImageDigest string `json:"imageDigest,omitempty"`
}

// RevisionStatus is what the controller made for a Revision and observed.
type RevisionStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready, ResourcesAvailable, ContainerHealthy, Active;
	// PodSpecAllowed, only while False (reason FieldNotAllowed): the
	// Revision uses pod-spec fields the cluster's configuration does not
	// allow, and a Deployment made before they were turned off stays.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// DeploymentName is the Deployment that runs the Revision's pods.
	// +optional
	DeploymentName string `json:"deploymentName,omitempty"`
	// PodAutoscalerName is the PodAutoscaler (sockscale.dev) that scales it.
	// +optional
	PodAutoscalerName string `json:"podAutoscalerName,omitempty"`
	// ServiceName is the Revision's public Kubernetes Service (switched
	// between pods and activators by its ServerlessService).
	// +optional
	ServiceName string `json:"serviceName,omitempty"`
	// PrivateServiceName is the Service whose endpoints are always the pods.
	// +optional
	PrivateServiceName string `json:"privateServiceName,omitempty"`
	// +optional
	ContainerStatuses []ContainerStatus `json:"containerStatuses,omitempty"`
	// ActualReplicas is the Revision's ready pods.
	// +optional
	ActualReplicas *int32 `json:"actualReplicas,omitempty"`
	// DesiredReplicas is the PodAutoscaler's decision.
	// +optional
	DesiredReplicas *int32 `json:"desiredReplicas,omitempty"`
	// RoutingState is Knative's: active while a Route gives the Revision
	// a share or a tag, pending while it is its Service's newest and not
	// routed yet, reserve when nothing routes to it (it then scales to
	// zero whatever its min-scale, and may be garbage-collected).
	// +kubebuilder:validation:Enum=active;pending;reserve
	// +optional
	RoutingState RoutingState `json:"routingState,omitempty"`
	// RoutingStateModified is when RoutingState last changed: for a
	// reserve Revision, when it was last routed.
	// +optional
	RoutingStateModified *metav1.Time `json:"routingStateModified,omitempty"`
}

// RoutingState says whether Routes send a Revision traffic.
type RoutingState string

// Routing states.
const (
	RoutingStateActive  RoutingState = "active"
	RoutingStatePending RoutingState = "pending"
	RoutingStateReserve RoutingState = "reserve"
)

// NoGCAnnotation "true" on a Revision keeps it from garbage collection
// (Knative's key).
const NoGCAnnotation = "serving.knative.dev/no-gc"

// Revision is one immutable version of a Service's template, named
// <service>-00001, -00002, ... unless the template names it. It is run by
// a Deployment, scaled by a PodAutoscaler, and reached through a public and
// a private Kubernetes Service.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ssrev,categories=sockscale
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name becomes a Kubernetes Service's name and a host name: a DNS-1035 label (lowercase letters, digits and '-', starting with a letter), at most 63 characters"
// +kubebuilder:printcolumn:name="Service",type=string,JSONPath=`.metadata.labels['serving\.sockscale\.dev/service']`
// +kubebuilder:printcolumn:name="Routing",type=string,JSONPath=`.status.routingState`
// +kubebuilder:printcolumn:name="Concurrency",type=integer,JSONPath=`.spec.containerConcurrency`,description="containerConcurrency: the hard limit per pod; 0 or empty: none"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Actual",type=integer,JSONPath=`.status.actualReplicas`,description="ready pods"
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.status.desiredReplicas`,description="the PodAutoscaler's decision"
type Revision struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is fixed at creation: a change is a new Revision.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a Revision's spec is immutable: change the Service's template to make a new Revision"
	Spec   RevisionSpec   `json:"spec"`
	Status RevisionStatus `json:"status,omitempty"`
}

// RevisionList is a list of Revisions.
//
// +kubebuilder:object:root=true
type RevisionList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Revision `json:"items"`
}
