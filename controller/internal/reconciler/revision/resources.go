package revision

import (
	"fmt"
	"maps"
	"net/url"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/controller/internal/config"
)

// Defaults a Revision's objects get where its spec says nothing, Knative's
// values.
const (
	// DefaultPort is the serving container's port when it declares none.
	DefaultPort = 8080
	// PublicPort is the public Service's port clients call.
	PublicPort = 80
	// DefaultContainerName names an unnamed container (user-container-<i>
	// when there are several).
	DefaultContainerName = "user-container"
	// progressDeadlineSeconds: Knative's progress-deadline (600 s), after
	// which the PodAutoscaler counts a Deployment with no ready pod as
	// failing.
	progressDeadlineSeconds = 600
)

// DeploymentName is the Revision's Deployment: Knative's suffix. The
// PodAutoscaler and the public Service take the Revision's own name (so
// does the ServerlessService the PodAutoscaler makes).
func DeploymentName(rev string) string { return rev + "-deployment" }

// PodAutoscalerName is the Revision's PodAutoscaler.
func PodAutoscalerName(rev string) string { return rev }

// PublicServiceName is the Revision's public Service (and its
// ServerlessService's name).
func PublicServiceName(rev string) string { return rev }

// annotationsNotCopied are Revision annotations its pods do not get:
// kubectl's copy of the whole object, and the autoscaling class, which
// goes to the PodAutoscaler's spec instead (a class changed on the pod
// template would roll the pods of every Revision that set it when sockscale
// began to copy it).
var annotationsNotCopied = map[string]bool{
	"kubectl.kubernetes.io/last-applied-configuration": true,
	config.AnnotationPrefix + "class":                  true,
}

// internalAnnotationPrefix marks annotations sockscale writes for itself
// (the Service reconciler's template hash); pods do not get them.
const internalAnnotationPrefix = "serving.sockscale.dev/"

// podLabels are the labels of the Revision's pods, Deployment and
// PodAutoscaler: the Revision's own labels (its template's, copied by the
// Service) and the revision and service labels.
func podLabels(rev *servingv1alpha1.Revision) map[string]string {
	l := maps.Clone(rev.Labels)
	if l == nil {
		l = map[string]string{}
	}
	l[servingv1alpha1.RevisionLabelKey] = rev.Name
	return l
}

// ownLabels are the labels that say which Revision (and Service) an object
// belongs to.
func ownLabels(rev *servingv1alpha1.Revision) map[string]string {
	l := map[string]string{servingv1alpha1.RevisionLabelKey: rev.Name}
	if s := rev.Labels[servingv1alpha1.ServiceLabelKey]; s != "" {
		l[servingv1alpha1.ServiceLabelKey] = s
	}
	return l
}

// podAnnotations are the Revision's annotations its pods carry, among them
// the autoscaling.knative.dev/<key> ones: the PodAutoscaler reads those
// from the Deployment's pod template (config.ForPodAutoscaler).
func podAnnotations(rev *servingv1alpha1.Revision) map[string]string {
	var a map[string]string
	for k, v := range rev.Annotations {
		if annotationsNotCopied[k] || strings.HasPrefix(k, internalAnnotationPrefix) {
			continue
		}
		if a == nil {
			a = map[string]string{}
		}
		a[k] = v
	}
	return a
}

// servingIndex is the container that serves requests: the only one, or
// the one that sets ports (the API server allows exactly one).
func servingIndex(spec *servingv1alpha1.RevisionSpec) int {
	for i, c := range spec.Containers {
		if len(c.Ports) > 0 {
			return i
		}
	}
	return 0
}

// ServingPort is the port the Revision's serving container listens on:
// its one declared port, else 8080.
func ServingPort(spec *servingv1alpha1.RevisionSpec) int32 {
	if len(spec.Containers) == 0 {
		return DefaultPort
	}
	c := spec.Containers[servingIndex(spec)]
	if len(c.Ports) > 0 && c.Ports[0].ContainerPort > 0 {
		return c.Ports[0].ContainerPort
	}
	return DefaultPort
}

// timeoutSeconds is the request timeout: the spec's, else 300 s.
func timeoutSeconds(spec *servingv1alpha1.RevisionSpec) int64 {
	if spec.TimeoutSeconds != nil {
		return *spec.TimeoutSeconds
	}
	return v1alpha1.DefaultTimeoutSeconds
}

// MakeDeployment is the Deployment that runs a Revision's pods. Replicas
// are left to the PodAutoscaler (through /scale): unset here, so a new
// Deployment starts at Kubernetes' 1 and the autoscaler takes it from
// there. drainPort, when not 0, is the node agents' drain port: every
// container gets a preStop hook that waits there (drainHook).
func MakeDeployment(rev *servingv1alpha1.Revision, drainPort int32) *appsv1.Deployment {
	spec := &rev.Spec
	pod := corev1.PodSpec{
		Volumes:                      spec.Volumes,
		ServiceAccountName:           spec.ServiceAccountName,
		ImagePullSecrets:             spec.ImagePullSecrets,
		EnableServiceLinks:           spec.EnableServiceLinks,
		AutomountServiceAccountToken: spec.AutomountServiceAccountToken,
		NodeSelector:                 spec.NodeSelector,
		Tolerations:                  spec.Tolerations,
		SecurityContext:              spec.SecurityContext,
		// A pod being removed gets as long as a request may take, so the
		// requests it has in flight can finish (Knative does the same).
		TerminationGracePeriodSeconds: ptr.To(timeoutSeconds(spec)),
	}
	serving := servingIndex(spec)
	for i := range spec.Containers {
		c := makeContainer(rev, i, i == serving)
		if drainPort != 0 {
			c.Lifecycle = &corev1.Lifecycle{PreStop: drainHook(rev, drainPort)}
		}
		pod.Containers = append(pod.Containers, c)
	}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: rev.Namespace, Name: DeploymentName(rev.Name), Labels: podLabels(rev)},
		Spec: appsv1.DeploymentSpec{
			Selector:                &metav1.LabelSelector{MatchLabels: map[string]string{servingv1alpha1.RevisionLabelKey: rev.Name}},
			ProgressDeadlineSeconds: ptr.To(int32(progressDeadlineSeconds)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels(rev), Annotations: podAnnotations(rev)},
				Spec:       pod,
			},
		},
	}
}

// drainHook is the preStop hook that holds a leaving pod's containers
// until its node's agent has drained it: its clients moved off their
// kept-alive connections and its requests in flight answered (the agent's
// GET /drain, on the node's loopback; the kubelet makes the request from
// the node). Only then does the kubelet send SIGTERM, so an app that
// exits at once loses nothing; the pod's grace period (the Revision's
// timeout) bounds the wait. Every container has it: a helper container
// that exited first would fail the requests still using it. An agent
// that does not answer fails the hook, and the kubelet goes on at once,
// as without it.
func drainHook(rev *servingv1alpha1.Revision, port int32) *corev1.LifecycleHandler {
	q := url.Values{"namespace": {rev.Namespace}, "workload": {DeploymentName(rev.Name)}}
	return &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{
		Host: "127.0.0.1", Port: intstr.FromInt32(port), Path: "/drain?" + q.Encode(),
		Scheme: corev1.URISchemeHTTP, // what the API server would default, so the live spec compares equal
	}}
}

// containerName is Knative's default name of the i-th of n containers.
func containerName(name string, i, n int) string {
	switch {
	case name != "":
		return name
	case n == 1:
		return DefaultContainerName
	default:
		return fmt.Sprintf("%s-%d", DefaultContainerName, i)
	}
}

// makeContainer translates the i-th container. The serving one gets its
// port (8080 unless set), the PORT and K_* variables Knative gives it, and
// Knative's default readiness probe (a TCP connect to its port) when it
// has none.
func makeContainer(rev *servingv1alpha1.Revision, i int, serving bool) corev1.Container {
	in := rev.Spec.Containers[i]
	c := corev1.Container{
		Name:                     containerName(in.Name, i, len(rev.Spec.Containers)),
		Image:                    in.Image,
		Command:                  in.Command,
		Args:                     in.Args,
		WorkingDir:               in.WorkingDir,
		EnvFrom:                  in.EnvFrom,
		Env:                      in.Env,
		Resources:                in.Resources,
		VolumeMounts:             in.VolumeMounts,
		TerminationMessagePath:   in.TerminationMessagePath,
		TerminationMessagePolicy: in.TerminationMessagePolicy,
		ImagePullPolicy:          in.ImagePullPolicy,
		SecurityContext:          in.SecurityContext,
	}
	if c.TerminationMessagePolicy == "" {
		// Knative's default: a crash's last log lines become the message.
		c.TerminationMessagePolicy = corev1.TerminationMessageFallbackToLogsOnError
	}
	var port int32
	if serving {
		port = ServingPort(&rev.Spec)
		p := corev1.ContainerPort{Name: "user-port", ContainerPort: port, Protocol: corev1.ProtocolTCP}
		if len(in.Ports) > 0 {
			if in.Ports[0].Name != "" {
				p.Name = in.Ports[0].Name
			}
			if in.Ports[0].Protocol != "" {
				p.Protocol = in.Ports[0].Protocol
			}
		}
		c.Ports = []corev1.ContainerPort{p}
		c.Env = withEnv(c.Env, runtimeEnv(rev, port))
	}
	c.LivenessProbe = translateProbe(in.LivenessProbe, port, false)
	c.ReadinessProbe = translateProbe(in.ReadinessProbe, port, true)
	c.StartupProbe = translateProbe(in.StartupProbe, port, false)
	if serving && c.ReadinessProbe == nil {
		c.ReadinessProbe = translateProbe(&servingv1alpha1.Probe{ProbeHandler: servingv1alpha1.ProbeHandler{TCPSocket: &servingv1alpha1.TCPSocketAction{}}}, port, true)
	}
	return c
}

// runtimeEnv is what Knative tells the serving container: PORT to listen
// on, and its revision, configuration and service (a sockscale Service is
// its own configuration).
func runtimeEnv(rev *servingv1alpha1.Revision, port int32) []corev1.EnvVar {
	env := []corev1.EnvVar{{Name: "PORT", Value: fmt.Sprint(port)}, {Name: "K_REVISION", Value: rev.Name}}
	if s := rev.Labels[servingv1alpha1.ServiceLabelKey]; s != "" {
		env = append(env, corev1.EnvVar{Name: "K_CONFIGURATION", Value: s}, corev1.EnvVar{Name: "K_SERVICE", Value: s})
	}
	return env
}

// withEnv appends add to env, except the names env already sets: the
// user's value stands.
func withEnv(env, add []corev1.EnvVar) []corev1.EnvVar {
	set := map[string]bool{}
	for _, e := range env {
		set[e.Name] = true
	}
	out := append([]corev1.EnvVar(nil), env...)
	for _, e := range add {
		if !set[e.Name] {
			out = append(out, e)
		}
	}
	return out
}

// translateProbe makes a Kubernetes probe: an unset port is the serving
// container's (port; 0 for another container leaves it to the API server
// to refuse, as Kubernetes would), and zero timings get Kubernetes'
// defaults written out, so the Deployment compares equal to what the API
// server stores. A readiness probe's periodSeconds 0 means "probe
// aggressively" in Knative; the closest a kubelet does is every second.
func translateProbe(p *servingv1alpha1.Probe, port int32, readiness bool) *corev1.Probe {
	if p == nil {
		return nil
	}
	out := &corev1.Probe{
		InitialDelaySeconds:           p.InitialDelaySeconds,
		TimeoutSeconds:                orDefault(p.TimeoutSeconds, 1),
		PeriodSeconds:                 orDefault(p.PeriodSeconds, 10),
		SuccessThreshold:              orDefault(p.SuccessThreshold, 1),
		FailureThreshold:              orDefault(p.FailureThreshold, 3),
		TerminationGracePeriodSeconds: p.TerminationGracePeriodSeconds,
	}
	if readiness && p.PeriodSeconds == 0 {
		out.PeriodSeconds = 1
	}
	fill := func(ps *intstr.IntOrString) intstr.IntOrString {
		if ps == nil || (ps.Type == intstr.Int && ps.IntVal == 0) || (ps.Type == intstr.String && ps.StrVal == "") {
			return intstr.FromInt32(port)
		}
		return *ps
	}
	switch h := p.ProbeHandler; {
	case h.Exec != nil:
		out.Exec = h.Exec.DeepCopy()
	case h.HTTPGet != nil:
		out.HTTPGet = &corev1.HTTPGetAction{Path: h.HTTPGet.Path, Port: fill(h.HTTPGet.Port), Host: h.HTTPGet.Host,
			Scheme: h.HTTPGet.Scheme, HTTPHeaders: h.HTTPGet.HTTPHeaders}
	case h.TCPSocket != nil:
		out.TCPSocket = &corev1.TCPSocketAction{Port: fill(h.TCPSocket.Port), Host: h.TCPSocket.Host}
	case h.GRPC != nil:
		g := &corev1.GRPCAction{Port: h.GRPC.Port, Service: h.GRPC.Service}
		if g.Port == 0 {
			g.Port = port
		}
		out.GRPC = g
	default:
		// Knative: a probe with no handler checks the container's port.
		out.TCPSocket = &corev1.TCPSocketAction{Port: intstr.FromInt32(port)}
	}
	return out
}

func orDefault(v, def int32) int32 {
	if v == 0 {
		return def
	}
	return v
}

// MakePublicService is the Revision's public Service: ClusterIP, no
// selector (its ServerlessService writes the EndpointSlices: the pods or
// activators), port 80 to the serving container's port, as Knative's
// revision Services. A serving port named h2c makes an http2 port with
// Kubernetes' h2c app protocol. It prefers dual-stack: on a dual-stack
// cluster the Revision is reachable over both families (the agents split
// a dual-stack Route's connects per family, and a family the Revision
// lacked would be left to the activators); elsewhere it is single-stack
// as any Service. Set at creation only: a Service a user made
// single-stack stays so.
func MakePublicService(rev *servingv1alpha1.Revision) *corev1.Service {
	p := corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: PublicPort, TargetPort: intstr.FromInt32(ServingPort(&rev.Spec))}
	if isH2C(&rev.Spec) {
		p.Name, p.AppProtocol = "http2", ptr.To("kubernetes.io/h2c")
	}
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: rev.Namespace, Name: PublicServiceName(rev.Name), Labels: ownLabels(rev)},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{p},
			IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyPreferDualStack)},
	}
}

func isH2C(spec *servingv1alpha1.RevisionSpec) bool {
	if len(spec.Containers) == 0 {
		return false
	}
	c := spec.Containers[servingIndex(spec)]
	return len(c.Ports) > 0 && c.Ports[0].Name == "h2c"
}

// MakePodAutoscaler is the Revision's PodAutoscaler: it scales the
// Deployment and switches the public Service's port 80. containerConcurrency
// and timeoutSeconds go to its spec. The autoscaling.knative.dev/<key>
// annotations reach it through the Deployment's pod template, where it
// reads them (below its spec, above the cluster defaults).
func MakePodAutoscaler(rev *servingv1alpha1.Revision) *v1alpha1.PodAutoscaler {
	spec := v1alpha1.PodAutoscalerSpec{
		ScaleTargetRef: v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: DeploymentName(rev.Name)},
		Service:        v1alpha1.ServiceRef{Name: PublicServiceName(rev.Name), Port: PublicPort},
	}
	if cc := rev.Spec.ContainerConcurrency; cc != nil {
		spec.ContainerConcurrency = int32(*cc)
	}
	if ts := rev.Spec.TimeoutSeconds; ts != nil {
		spec.TimeoutSeconds = ptr.To(int32(*ts))
	}
	if class := rev.Annotations[config.AnnotationPrefix+"class"]; class != "" {
		spec.Class = v1alpha1.Class(class) // the API server allows only the classes there are
	}
	return &v1alpha1.PodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: rev.Namespace, Name: PodAutoscalerName(rev.Name), Labels: ownLabels(rev)},
		Spec:       spec,
	}
}
