package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Mode says where a target's public Service sends traffic.
// +kubebuilder:validation:Enum=Serve;Proxy
type Mode string

const (
	// ModeServe means the public endpoints are the target's pods.
	ModeServe Mode = "Serve"
	// ModeProxy means the public endpoints are activators (scale from
	// zero, or not enough burst capacity).
	ModeProxy Mode = "Proxy"
)

// Class says which autoscaler sizes a target: the values of Knative's
// autoscaling.knative.dev/class annotation.
// +kubebuilder:validation:Enum=kpa.autoscaling.knative.dev;hpa.autoscaling.knative.dev;external.autoscaling.sockscale.dev
type Class string

const (
	// ClassKPA is sockscale's own autoscaler (Knative's KPA): it decides
	// every count from 0 to max-scale.
	ClassKPA Class = "kpa.autoscaling.knative.dev"
	// ClassHPA hands the counts from 1 up to a HorizontalPodAutoscaler
	// that sockscale makes and owns; sockscale keeps zero (scale to zero
	// when idle, the activator holding requests, the scale from zero).
	ClassHPA Class = "hpa.autoscaling.knative.dev"
	// ClassExternal leaves every count, zero included, to an autoscaler
	// the user runs (their own HPA with HPAScaleToZero, KEDA): sockscale
	// never scales the target, and only puts the activator in front of it
	// while no pod is ready, so requests at zero are held until that
	// autoscaler brings a pod (it sees them in the metrics APIs'
	// concurrency and activator_concurrency, or KEDA's scaler).
	ClassExternal Class = "external.autoscaling.sockscale.dev"
)

// ScaleTargetRef points at what is scaled, in the PodAutoscaler's
// namespace: a Deployment, a StatefulSet, or any kind with a /scale
// subresource that the cluster lets PodAutoscalers scale (the controller's
// --scale-target-kinds; others get Ready=False ScaleTargetNotAllowed). A
// kind other than Deployment is read and scaled through its /scale, whose
// status.selector must be equality only (a=b,c=d): the private Service
// selects the same pods.
type ScaleTargetRef struct {
	// APIVersion of the target, group/version (v1 for the core group),
	// e.g. apps/v1.
	// +kubebuilder:validation:MinLength=1
	APIVersion string `json:"apiVersion"`
	// Kind of the target, e.g. Deployment or StatefulSet.
	// +kubebuilder:validation:MinLength=1
	Kind string `json:"kind"`
	// Name of the target.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
}

// ServiceRef names the Service clients call; it becomes the public service.
type ServiceRef struct {
	// Name of the public Service. At most 55 characters: the target's
	// private Service is named after it with "-private" appended, and a
	// Service name has at most 63.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=55
	Name string `json:"name"`
	// Port of the Service the target serves on; 0 or unset: every port.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`
}

// DefaultTimeoutSeconds is a target's request timeout when its spec sets
// none (Knative's revision-timeout-seconds default).
const DefaultTimeoutSeconds = 300

// PodAutoscalerSpec is what users ask for. Every key of Knative's KPA has a
// field here; unset fields take the autoscaling.knative.dev/<key>
// annotation of the target's pod template, then the cluster defaults.
//
// +kubebuilder:validation:XValidation:rule="!has(self.minScale) || !has(self.maxScale) || self.maxScale == 0 || self.minScale <= self.maxScale",message="minScale must not exceed maxScale (maxScale 0 means unlimited)"
// +kubebuilder:validation:XValidation:rule="!has(self.activationScale) || !has(self.maxScale) || self.maxScale == 0 || self.activationScale <= self.maxScale",message="activationScale must not exceed maxScale"
// +kubebuilder:validation:XValidation:rule="!has(self.activationScale) || !has(self.minScale) || self.minScale <= self.activationScale",message="minScale must not exceed activationScale"
// +kubebuilder:validation:XValidation:rule="!has(self.metric) || !(self.metric in ['cpu', 'memory']) || !has(self.class) || self.class == 'hpa.autoscaling.knative.dev'",message="metric cpu and memory need class hpa.autoscaling.knative.dev: the KPA scales on concurrency or rps"
// +kubebuilder:validation:XValidation:rule="!has(self.minScaleSchedule) || !has(self.maxScale) || self.maxScale == 0 || self.minScaleSchedule.windows.all(w, w.minScale <= self.maxScale)",message="a minScaleSchedule window's minScale must not exceed maxScale"
// +kubebuilder:validation:XValidation:rule="!has(self.minScaleSchedule) || !has(self.class) || self.class != 'external.autoscaling.sockscale.dev'",message="minScaleSchedule does not apply to class external.autoscaling.sockscale.dev: the external autoscaler decides every count"
type PodAutoscalerSpec struct {
	ScaleTargetRef ScaleTargetRef `json:"scaleTargetRef"`
	Service        ServiceRef     `json:"service"`

	// Class is the autoscaler that sizes the target:
	// kpa.autoscaling.knative.dev (sockscale's own),
	// hpa.autoscaling.knative.dev (a HorizontalPodAutoscaler of the same
	// name that sockscale makes and owns scales it from 1 up; sockscale
	// still takes it to zero and back) or
	// external.autoscaling.sockscale.dev (the user's own HPA or KEDA
	// scales it, zero included; sockscale only holds requests in the
	// activator while no pod is ready). Unset: the pod template annotation
	// autoscaling.knative.dev/class, else the KPA.
	// +optional
	Class Class `json:"class,omitempty"`
	// Metric to scale on: concurrency or rps (requests counted by the
	// agents), or, with the HPA class only, cpu or memory (the resource
	// metrics API). Unset: the scale target's pod template annotation
	// autoscaling.knative.dev/metric, else concurrency, or cpu with the
	// HPA class (as in Knative). Not defaulted by the API server, or it
	// would hide the annotation.
	// +kubebuilder:validation:Enum=concurrency;rps;cpu;memory
	// +optional
	Metric string `json:"metric,omitempty"`
	// Target per pod for the metric (before utilization): concurrent
	// requests or requests per second; with the HPA class, cpu is a
	// percentage of the pods' CPU requests (unset: 80) and memory
	// mebibytes per pod (required).
	// +kubebuilder:validation:XValidation:rule="self >= 0.01",message="target must be at least 0.01"
	// +optional
	Target *float64 `json:"target,omitempty"`
	// ContainerConcurrency is the hard limit of requests one pod gets at
	// once through the activator; 0 means no limit.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +optional
	ContainerConcurrency int32 `json:"containerConcurrency,omitempty"`
	// TimeoutSeconds bounds how long the activator holds and forwards one
	// request for this target (Knative's Revision timeoutSeconds): a
	// request still waiting for a pod then gets 504. Unset: 300.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=600
	// +optional
	TimeoutSeconds *int32 `json:"timeoutSeconds,omitempty"`

	// +kubebuilder:validation:Minimum=0
	// +optional
	MinScale *int32 `json:"minScale,omitempty"`
	// MaxScale: 0 means unlimited.
	// +kubebuilder:validation:Minimum=0
	// +optional
	MaxScale *int32 `json:"maxScale,omitempty"`
	// +kubebuilder:validation:Minimum=0
	// +optional
	InitialScale *int32 `json:"initialScale,omitempty"`
	// ActivationScale: the pods a scale from zero starts with.
	// +kubebuilder:validation:Minimum=2
	// +optional
	ActivationScale *int32 `json:"activationScale,omitempty"`
	// ScaleDownDelay: a scale-down must be wanted this long (whole seconds,
	// 0s..1h).
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('1h')",message="scaleDownDelay must be from 0s to 1h"
	// +kubebuilder:validation:XValidation:rule="duration(self).getMilliseconds() % 1000 == 0",message="scaleDownDelay must be whole seconds (as in Knative)"
	// +optional
	ScaleDownDelay *metav1.Duration `json:"scaleDownDelay,omitempty"`
	// TargetUtilizationPercentage is the share of Target each pod is
	// aimed at. Unset: the autoscaler ConfigMap's
	// container-concurrency-target-percentage for concurrency, a fixed 70
	// for rps (as in Knative).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	TargetUtilizationPercentage *float64 `json:"targetUtilizationPercentage,omitempty"`
	// TargetBurstCapacity: -1 keeps the activator in the path, 0 never.
	// +kubebuilder:validation:XValidation:rule="self == -1.0 || self >= 0.0",message="targetBurstCapacity must be -1 (activator always in the path), 0, or positive"
	// +optional
	TargetBurstCapacity *float64 `json:"targetBurstCapacity,omitempty"`
	// Window is the stable window: whole seconds from 6s to 1h.
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('6s') && duration(self) <= duration('1h') && duration(self).getMilliseconds() % 1000 == 0",message="window must be whole seconds from 6s to 1h"
	// +optional
	Window *metav1.Duration `json:"window,omitempty"`
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	PanicWindowPercentage *float64 `json:"panicWindowPercentage,omitempty"`
	// +kubebuilder:validation:Minimum=110
	// +kubebuilder:validation:Maximum=1000
	// +optional
	PanicThresholdPercentage *float64 `json:"panicThresholdPercentage,omitempty"`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('0s') && duration(self) <= duration('1h')",message="scaleToZeroPodRetentionPeriod must be from 0s to 1h"
	// +optional
	ScaleToZeroPodRetentionPeriod *metav1.Duration `json:"scaleToZeroPodRetentionPeriod,omitempty"`
	// +kubebuilder:validation:Enum=linear;weighted-exponential
	// +optional
	MetricAggregationAlgorithm string `json:"metricAggregationAlgorithm,omitempty"`
	// Reachability is Knative's: Unreachable says no Route sends the
	// target traffic (an old Revision), so it scales down at once and
	// min-scale, initial-scale and the pod retention period no longer
	// hold pods for it. Unset or Reachable: reachable while its public
	// Service exists. The serving API's Revisions set it.
	// +kubebuilder:validation:Enum=Reachable;Unreachable
	// +optional
	Reachability Reachability `json:"reachability,omitempty"`
	// Activator says how the activators treat the target's requests
	// while they are in its path.
	// +optional
	Activator *ActivatorSpec `json:"activator,omitempty"`
	// MinScaleSchedule raises min-scale in time windows (working hours,
	// a daily batch): while a window applies, the target keeps at least
	// its minScale pods. Not with the external class, whose own
	// autoscaler decides every count.
	// +optional
	MinScaleSchedule *MinScaleSchedule `json:"minScaleSchedule,omitempty"`
}

// MinScaleSchedule is a set of windows of a time zone in which min-scale
// is raised.
//
// +kubebuilder:validation:XValidation:rule="self.timeZone != 'Local' && timestamp('2026-01-01T00:00:00Z').getHours(self.timeZone) >= 0",message="timeZone must be an IANA time zone name such as Europe/Berlin, or UTC"
type MinScaleSchedule struct {
	// TimeZone is the windows' clock: an IANA time zone name such as
	// Europe/Berlin or America/New_York, or UTC. Always explicit, so a
	// window never moves with the controller's own zone; daylight saving
	// follows the zone's rules.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$`
	TimeZone string `json:"timeZone"`
	// Windows; where several apply at once, the highest minScale wins.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +listType=map
	// +listMapKey=name
	Windows []MinScaleWindow `json:"windows"`
}

// MinScaleWindow is a daily time window, on some weekdays, in which the
// target keeps at least MinScale pods.
//
// +kubebuilder:validation:XValidation:rule="self.start != self.end",message="start and end must differ (a window ending before it starts runs past midnight)"
type MinScaleWindow struct {
	// Name says which window applies, in status.minScaleWindow.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`
	// Days the window starts on. Unset: every day.
	// +kubebuilder:validation:MaxItems=7
	// +listType=set
	// +optional
	Days []Weekday `json:"days,omitempty"`
	// Start is the local time the window opens, HH:MM (00:00 to 23:59).
	// +kubebuilder:validation:Pattern=`^([01][0-9]|2[0-3]):[0-5][0-9]$`
	Start string `json:"start"`
	// End is the local time it closes, HH:MM, 24:00 for midnight; an end
	// before the start closes it the next day.
	// +kubebuilder:validation:Pattern=`^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$`
	End string `json:"end"`
	// MinScale is the fewest pods while the window applies.
	// +kubebuilder:validation:Minimum=1
	MinScale int32 `json:"minScale"`
}

// Weekday is a day of the week, as its first three letters.
// +kubebuilder:validation:Enum=Mon;Tue;Wed;Thu;Fri;Sat;Sun
type Weekday string

// ColdStartHeader is the response header the activator adds to a pod's
// response to a request it held while the target had no ready pod: the
// seconds it was held, in decimal (e.g. "1.234").
const ColdStartHeader = "Sockscale-Cold-Start"

// MaxQueueDepth is the most a target's queueDepth may ask for (and the
// activator's --queue-depth at most).
const MaxQueueDepth = 1_000_000

// ActivatorSpec is how the activators treat a target's requests.
type ActivatorSpec struct {
	// ColdStartHeader: a response to a request held through a cold start
	// (it waited while the target had no ready pod) carries the header
	// Sockscale-Cold-Start with the seconds it was held. Unset: true.
	// +optional
	ColdStartHeader *bool `json:"coldStartHeader,omitempty"`
	// QueueDepth is the most requests of the target one activator holds
	// at once; more are answered 503 with Retry-After. At most the
	// activator's own depth (the chart's activator.queueDepth), which it
	// is when unset.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	// +optional
	QueueDepth *int32 `json:"queueDepth,omitempty"`
	// HealthChecks are requests the activators answer themselves while
	// the target has no ready pod: a load balancer's or uptime checker's
	// probes then neither wake the target nor keep it awake, and are not
	// counted as load. Once a pod is ready they go to the pods like any
	// request.
	// +optional
	HealthChecks *HealthChecks `json:"healthChecks,omitempty"`
}

// HealthChecks says which requests are health checks and how the
// activator answers them. A GET or HEAD request is one when its path is
// one of Paths (if set) and its User-Agent contains one of UserAgents (if
// set); other methods never are.
//
// +kubebuilder:validation:XValidation:rule="has(self.paths) || has(self.userAgents)",message="healthChecks needs paths, userAgents or both: with neither, every GET would be answered by the activator"
type HealthChecks struct {
	// Paths are request paths, exactly as sent without the query (e.g.
	// /healthz). Unset: any path of a listed user agent.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +listType=set
	// +optional
	Paths []HealthCheckPath `json:"paths,omitempty"`
	// UserAgents are parts of User-Agent headers (case-sensitive, e.g.
	// ELB-HealthChecker or UptimeRobot). Unset: any user agent on a
	// listed path.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	// +listType=set
	// +optional
	UserAgents []HealthCheckUserAgent `json:"userAgents,omitempty"`
	// Status is the answer's HTTP status code. Unset: 200.
	// +kubebuilder:validation:Minimum=200
	// +kubebuilder:validation:Maximum=599
	// +optional
	Status *int32 `json:"status,omitempty"`
}

// HealthCheckPath is an absolute request path.
// +kubebuilder:validation:MaxLength=256
// +kubebuilder:validation:Pattern=`^/[^?#\s]*$`
type HealthCheckPath string

// HealthCheckUserAgent is part of a User-Agent header.
// +kubebuilder:validation:MinLength=1
// +kubebuilder:validation:MaxLength=128
// +kubebuilder:validation:Pattern=`^[\x21-\x7e][\x20-\x7e]*$`
type HealthCheckUserAgent string

// Reachability says whether traffic is routed to a target.
type Reachability string

// Reachabilities.
const (
	ReachabilityReachable   Reachability = "Reachable"
	ReachabilityUnreachable Reachability = "Unreachable"
)

// Accounting says how the agents counted a target's load: what its
// concurrency is a count of.
// +kubebuilder:validation:Enum=Requests;Connections
type Accounting string

const (
	// AccountingRequests says the pods' connections were HTTP/1.x or HTTP/2
	// with prior knowledge (h2c, gRPC), each request or stream counted,
	// or too few were not for it to matter.
	AccountingRequests Accounting = "Requests"
	// AccountingConnections says a sizeable part of the load was on
	// connections that are neither (TLS, upgraded connections, other
	// protocols), each counted as one request in flight for its whole
	// life, so the target scales on connections in flight.
	AccountingConnections Accounting = "Connections"
)

// PodAutoscalerStatus is what the controller observed and decided.
type PodAutoscalerStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// DesiredScale is the decided pod count; -1 before any data.
	// +optional
	DesiredScale *int32 `json:"desiredScale,omitempty"`
	// ActualScale is the target's ready pods.
	// +optional
	ActualScale *int32 `json:"actualScale,omitempty"`
	// +optional
	Mode Mode `json:"mode,omitempty"`
	// ModeReason says why the target is in its mode: Serving; in Proxy,
	// ScaledToZero, NoBurstCapacity (not enough burst capacity, always
	// with targetBurstCapacity -1), ContainerConcurrency (the activators
	// keep each pod within its containerConcurrency, which the direct
	// path could not) or NoReadyPods; NoActivatorEndpoints when no
	// activator is ready: in Serve, the pods take requests directly; in
	// Proxy, a target with containerConcurrency, whose pods are not put
	// behind the public Service (nothing would hold them to the limit)
	// and whose requests fail until an activator is ready.
	// +optional
	ModeReason string `json:"modeReason,omitempty"`
	// StableValue and PanicValue are the metric's averages over the stable
	// and panic windows, as decimal strings. They are refreshed when one
	// moved by more than 5 % (or to or from 0), or along with any other
	// change of the status; smaller moves are not written (each target is
	// decided every 2 s, and writing every drift would cost the API server
	// a write per loaded target per tick). The controller's
	// sockscale_controller_stable_value and _panic_value metrics carry
	// every tick's values.
	// +optional
	StableValue string `json:"stableValue,omitempty"`
	// PanicValue: see StableValue.
	// +optional
	PanicValue string `json:"panicValue,omitempty"`
	// +optional
	Panicking bool `json:"panicking,omitempty"`
	// +optional
	ExcessBurstCapacity *int32 `json:"excessBurstCapacity,omitempty"`
	// Accounting is how the target's load was counted over the stable
	// window: Connections when connections counted per connection
	// (neither HTTP/1.x nor HTTP/2 with prior knowledge: TLS, upgraded
	// connections, other protocols) were at least 0.1 in flight and at
	// least 10 % of the pods' concurrency, else Requests. It is unset
	// until the target's pods report, and kept while none reports or the
	// window has less than 0.1 in flight in all (idle). Turning
	// Connections records a Warning event CountedPerConnection.
	// +optional
	Accounting Accounting `json:"accounting,omitempty"`
	// MinScaleWindow is the spec.minScaleSchedule window that applies
	// now (the one with the highest minScale if several do): the target
	// keeps at least its minScale pods. Unset: none applies.
	// +optional
	MinScaleWindow string `json:"minScaleWindow,omitempty"`
	// Activators in the target's path when in Proxy mode.
	// +optional
	Activators []string `json:"activators,omitempty"`
	// Conditions: Ready, Active, ScaleTargetInitialized. A message that
	// changes alone (same status and reason, such as a count of pods not
	// heard) is refreshed at most every 30 s.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// PodAutoscaler scales a Deployment on the requests its pods serve.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=pa,categories=sockscale
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.status.desiredScale`
// +kubebuilder:printcolumn:name="Actual",type=integer,JSONPath=`.status.actualScale`
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.status.mode`
// +kubebuilder:printcolumn:name="Mode Reason",type=string,JSONPath=`.status.modeReason`,description="Why the mode: Serving; ScaledToZero, NoBurstCapacity, ContainerConcurrency or NoReadyPods in Proxy; NoActivatorEndpoints with no activator ready"
// +kubebuilder:printcolumn:name="Stable",type=string,JSONPath=`.status.stableValue`
// +kubebuilder:printcolumn:name="Panic",type=boolean,JSONPath=`.status.panicking`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Activity",type=string,JSONPath=`.status.conditions[?(@.type=="Active")].reason`,description="Active; WaitingToScaleDown, WaitingForActivator or NoTraffic on the way to zero; Activating or ActivationTimeout on the way back"
// +kubebuilder:printcolumn:name="Min Window",type=string,JSONPath=`.status.minScaleWindow`,description="The spec.minScaleSchedule window that raises min-scale now, if any"
// +kubebuilder:printcolumn:name="Accounting",type=string,JSONPath=`.status.accounting`,priority=1,description="Requests, or Connections when a sizeable part of the load is on connections counted per connection (TLS, upgraded connections, other protocols)"
type PodAutoscaler struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PodAutoscalerSpec   `json:"spec"`
	Status PodAutoscalerStatus `json:"status,omitempty"`
}

// PodAutoscalerList is a list of PodAutoscalers.
//
// +kubebuilder:object:root=true
type PodAutoscalerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PodAutoscaler `json:"items"`
}
