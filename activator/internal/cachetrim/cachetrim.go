package cachetrim

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sockscale/sockscale/activator/internal/watch"
)

// Why trim: a PodAutoscaler names any Service of its namespace, and an
// Ingress or HTTPRoute of any namespace may name a target, so the
// activator watches every Service, EndpointSlice and Ingress of the
// cluster (no selector says "the ones a PodAutoscaler names"), and any
// tenant can grow its cache by creating them. What the watcher reads of
// them is small, so the rest is dropped as each object enters the cache.
// The activator never writes these objects, so a trimmed one is never
// written back.
//
// Every field packages watch (watch.go, routes.go, servingroutes.go) and
// netpol (admitter.go) read of the cache; nothing else in the activator
// reads it. Keep this list equal to the code: a field read but trimmed
// reads as empty.
//
//   - Every object: metadata.namespace, .name, .labels (watch keys, index
//     values), .ownerReferences (metav1.IsControlledBy, by UID),
//     .deletionTimestamp and .creationTimestamp (PodAutoscalers; Ingresses
//     and HTTPRoutes, whose age decides who owns a host they share).
//   - Service (targetOf, clusterIPs, podPortName, podsOf,
//     syncRouteService): labels serving.sockscale.dev/route and /tag,
//     ownerReferences (the private Service's controller), spec.clusterIP,
//     spec.clusterIPs, spec.ports[].name, .port, .protocol, .appProtocol.
//   - EndpointSlice (the event handler, podsOf, slicePods, slicePort):
//     labels kubernetes.io/service-name and
//     endpointslice.kubernetes.io/managed-by, ownerReferences,
//     addressType, ports[].name, .port, .protocol; and of a private
//     Service's IPv4 or IPv6 slice only, endpoints[].addresses,
//     .conditions.ready, .conditions.terminating, .targetRef.kind and
//     .targetRef.name.
//   - Ingress (ingressBackends, routeClaims, their indexes, routeTargets,
//     routeHosts, claimants): spec.rules[].host,
//     .http.paths[].backend.service.name, spec.defaultBackend.service.name.
//   - Pod (package netpol: PodIPs, podsAt, podOf), every pod of the
//     cluster: of its metadata only namespace, name, uid,
//     resourceVersion and labels; spec.hostNetwork, the name and ports
//     (name, containerPort, protocol) of containers and init containers
//     that have ports; status.phase, .podIP, .podIPs.
//   - Namespace (netpol's namespaceLabels): metadata only, without
//     annotations.
//   - NetworkPolicy (netpol's Admit, the evaluator): metadata without
//     annotations, the whole spec.
//   - PodAutoscaler, ServerlessService, Route (sockscale's own) and
//     HTTPRoute (unstructured, few; its status.parents say whether a
//     Gateway accepted it): kept whole but for managed fields.
//
// Managed fields and annotations (kubectl's last-applied-configuration
// alone is a copy of the object) are read of no object.

// Options are the activator's cache options: managed fields dropped from
// every object, and Services, EndpointSlices, Ingresses, Pods, Namespaces
// and NetworkPolicies trimmed as the functions of those names say. The caller sets the scheme,
// mapper and HTTP client.
func Options() cache.Options {
	return cache.Options{
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Service{}:             {Transform: Service},
			&discoveryv1.EndpointSlice{}:  {Transform: EndpointSlice},
			&networkingv1.Ingress{}:       {Transform: Ingress},
			&corev1.Pod{}:                 {Transform: Pod},
			&corev1.Namespace{}:           {Transform: Namespace},
			&networkingv1.NetworkPolicy{}: {Transform: NetworkPolicy},
		},
		DefaultTransform: stripManagedFields,
	}
}

// stripManagedFields is the default transform, which an object's own
// Transform replaces and so must apply itself.
var stripManagedFields = cache.TransformStripManagedFields()

// Service is the cache transform of Services: metadata without
// annotations, spec.clusterIP, .clusterIPs and the ports' name, port,
// protocol and appProtocol. The selector, the other spec fields and the
// status are dropped.
func Service(in any) (any, error) {
	in, _ = stripManagedFields(in)
	s, ok := in.(*corev1.Service)
	if !ok {
		return in, nil
	}
	s.Annotations = nil
	var ports []corev1.ServicePort
	for _, p := range s.Spec.Ports {
		ports = append(ports, corev1.ServicePort{Name: p.Name, Protocol: p.Protocol, AppProtocol: p.AppProtocol, Port: p.Port})
	}
	s.Spec = corev1.ServiceSpec{ClusterIP: s.Spec.ClusterIP, ClusterIPs: s.Spec.ClusterIPs, Ports: ports}
	s.Status = corev1.ServiceStatus{}
	return s, nil
}

// endpointSliceController is the managed-by label value of the slices
// Kubernetes computes from a Service's selector: the only ones the
// watcher takes pods from.
const endpointSliceController = "endpointslice-controller.k8s.io"

// EndpointSlice is the cache transform of EndpointSlices: metadata
// without annotations, the address type and ports; endpoints only of a
// slice the watcher could take pods from (the EndpointSlice controller's
// IPv4 slice of a Service named like a private one), each with its
// addresses and its ready and terminating conditions. Whether the slice
// is really the target's (its owner) is the watcher's check, on what is
// kept.
func EndpointSlice(in any) (any, error) {
	in, _ = stripManagedFields(in)
	s, ok := in.(*discoveryv1.EndpointSlice)
	if !ok {
		return in, nil
	}
	s.Annotations = nil
	if !podsMayBeRead(s) {
		s.Endpoints = nil
		return s, nil
	}
	for i, ep := range s.Endpoints {
		s.Endpoints[i] = discoveryv1.Endpoint{Addresses: ep.Addresses,
			Conditions: discoveryv1.EndpointConditions{Ready: ep.Conditions.Ready, Terminating: ep.Conditions.Terminating}}
		if ep.TargetRef != nil {
			// The pod's name alone: what tells a dual-stack pod's IPv4 and
			// IPv6 endpoints for one pod (watch's slicePods).
			s.Endpoints[i].TargetRef = &corev1.ObjectReference{Kind: ep.TargetRef.Kind, Name: ep.TargetRef.Name}
		}
	}
	return s, nil
}

// podsMayBeRead: the watcher's podsOf and slicePods could take pods from
// s (what they check of the slice's labels and address type).
func podsMayBeRead(s *discoveryv1.EndpointSlice) bool {
	if s.Labels[discoveryv1.LabelManagedBy] != endpointSliceController ||
		(s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6) {
		return false
	}
	public, private := strings.CutSuffix(s.Labels[discoveryv1.LabelServiceName], watch.PrivateSuffix)
	return private && public != ""
}

// Ingress is the cache transform of Ingresses: metadata without
// annotations, and of the spec only the host names and the names of the
// Service backends (rules' and default). TLS, paths, ports, resource
// backends, the class and the status are dropped.
func Ingress(in any) (any, error) {
	in, _ = stripManagedFields(in)
	ing, ok := in.(*networkingv1.Ingress)
	if !ok {
		return in, nil
	}
	ing.Annotations = nil
	spec := networkingv1.IngressSpec{DefaultBackend: serviceBackend(ing.Spec.DefaultBackend)}
	for _, r := range ing.Spec.Rules {
		rule := networkingv1.IngressRule{Host: r.Host}
		if r.HTTP != nil {
			rule.HTTP = &networkingv1.HTTPIngressRuleValue{}
			for _, p := range r.HTTP.Paths {
				if b := serviceBackend(&p.Backend); b != nil {
					rule.HTTP.Paths = append(rule.HTTP.Paths, networkingv1.HTTPIngressPath{Backend: *b})
				}
			}
		}
		spec.Rules = append(spec.Rules, rule)
	}
	ing.Spec = spec
	ing.Status = networkingv1.IngressStatus{}
	return ing, nil
}

// serviceBackend is b's Service's name alone; nil when b names no Service.
func serviceBackend(b *networkingv1.IngressBackend) *networkingv1.IngressBackend {
	if b == nil || b.Service == nil {
		return nil
	}
	return &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: b.Service.Name}}
}

// Pod is the cache transform of Pods, every pod of the cluster (package
// netpol: who a client address is, a destination's labels and named
// ports; package watch: how a pod says it is ready): of the metadata the
// key, uid, resourceVersion and labels; of the spec hostNetwork and the
// containers' and init containers' ports and HTTP readiness probes; of
// the status the phase and addresses. Owners, volumes, images, env,
// conditions and container statuses, most of a pod, are dropped.
func Pod(in any) (any, error) {
	p, ok := in.(*corev1.Pod)
	if !ok {
		return in, nil
	}
	out := &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID,
			ResourceVersion: p.ResourceVersion, Labels: p.Labels},
		Spec: corev1.PodSpec{HostNetwork: p.Spec.HostNetwork, InitContainers: containerPorts(p.Spec.InitContainers),
			Containers: containerPorts(p.Spec.Containers)},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs},
	}
	return out, nil
}

// containerPorts are the name, ports and HTTP readiness probe of the
// containers of cs that have ports or such a probe.
func containerPorts(cs []corev1.Container) []corev1.Container {
	var out []corev1.Container
	for _, c := range cs {
		probe := httpReadiness(c.ReadinessProbe)
		if len(c.Ports) == 0 && probe == nil {
			continue
		}
		var ports []corev1.ContainerPort
		for _, p := range c.Ports {
			ports = append(ports, corev1.ContainerPort{Name: p.Name, ContainerPort: p.ContainerPort, Protocol: p.Protocol})
		}
		out = append(out, corev1.Container{Name: c.Name, Ports: ports, ReadinessProbe: probe})
	}
	return out
}

// httpReadiness is a readiness probe's httpGet (path, port, scheme and
// headers; not its host, which the activator never probes), or nil.
func httpReadiness(p *corev1.Probe) *corev1.Probe {
	if p == nil || p.HTTPGet == nil {
		return nil
	}
	g := p.HTTPGet
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
		Path: g.Path, Port: g.Port, Scheme: g.Scheme, HTTPHeaders: g.HTTPHeaders}}}
}

// Namespace is the cache transform of Namespaces: metadata without
// annotations (namespaceSelectors read the labels); spec and status are
// dropped.
func Namespace(in any) (any, error) {
	in, _ = stripManagedFields(in)
	n, ok := in.(*corev1.Namespace)
	if !ok {
		return in, nil
	}
	n.Annotations = nil
	n.Spec, n.Status = corev1.NamespaceSpec{}, corev1.NamespaceStatus{}
	return n, nil
}

// NetworkPolicy is the cache transform of NetworkPolicies: metadata
// without annotations (kubectl's last-applied copy would double them),
// the whole spec.
func NetworkPolicy(in any) (any, error) {
	in, _ = stripManagedFields(in)
	p, ok := in.(*networkingv1.NetworkPolicy)
	if !ok {
		return in, nil
	}
	p.Annotations = nil
	return p, nil
}

var (
	_ toolscache.TransformFunc = Pod
	_ toolscache.TransformFunc = Namespace
	_ toolscache.TransformFunc = NetworkPolicy
	_ toolscache.TransformFunc = Service
	_ toolscache.TransformFunc = EndpointSlice
	_ toolscache.TransformFunc = Ingress
)
