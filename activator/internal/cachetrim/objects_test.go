package cachetrim

import (
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/sockscale/sockscale/api/autoscaling/v1alpha1"
	servingv1alpha1 "github.com/sockscale/sockscale/api/serving/v1alpha1"
	"github.com/sockscale/sockscale/internal/testutil/owned"
	"github.com/sockscale/sockscale/internal/testutil/workload"
)

// Objects as a cluster holds them: applied with kubectl (an annotation
// that copies the object), with managed fields, status and the fields
// the activator does not read.

// managed is a typical managedFields entry: who applied which fields.
func managed(manager string, fields string) []metav1.ManagedFieldsEntry {
	return []metav1.ManagedFieldsEntry{{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1",
		Time: ptr.To(metav1.Unix(1795000000, 0)), FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fields)}}
}

// lastApplied sets kubectl's last-applied-configuration annotation.
func lastApplied(o metav1.Object, whole any) {
	raw, err := json.Marshal(whole)
	if err != nil {
		panic(err) // these objects always marshal
	}
	a := o.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a["kubectl.kubernetes.io/last-applied-configuration"] = string(raw)
	o.SetAnnotations(a)
}

// userService is a tenant's Service with its ports, selector and a load
// balancer's status.
func userService(namespace, name string) *corev1.Service {
	s := &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("svc-" + name), ResourceVersion: "123456",
			CreationTimestamp: metav1.Unix(1795000000, 0),
			Labels:            map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "shop", "team": "checkout"},
			Annotations: map[string]string{"service.beta.kubernetes.io/aws-load-balancer-type": "nlb",
				"prometheus.io/scrape": "true", "prometheus.io/port": "9090"}},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.12.34", ClusterIPs: []string{"10.96.12.34"},
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicySingleStack),
			Selector:              map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "shop"},
			SessionAffinity:       corev1.ServiceAffinityNone,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyCluster, InternalTrafficPolicy: ptr.To(corev1.ServiceInternalTrafficPolicyCluster),
			AllocateLoadBalancerNodePorts: ptr.To(true),
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("http"), NodePort: 31080, AppProtocol: ptr.To("kubernetes.io/h2c")},
				{Name: "metrics", Protocol: corev1.ProtocolTCP, Port: 9090, TargetPort: intstr.FromInt32(9090), NodePort: 31090},
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(53), NodePort: 31053},
			},
		},
		Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{
			{Hostname: "a1b2c3d4e5f6-1234567890.elb.eu-west-1.amazonaws.com", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}}}},
	}
	lastApplied(s, s.Spec)
	s.ManagedFields = managed("kubectl-client-side-apply", `{"f:metadata":{"f:annotations":{".":{},"f:kubectl.kubernetes.io/last-applied-configuration":{},"f:prometheus.io/port":{},"f:prometheus.io/scrape":{},"f:service.beta.kubernetes.io/aws-load-balancer-type":{}},"f:labels":{".":{},"f:app.kubernetes.io/name":{},"f:app.kubernetes.io/part-of":{},"f:team":{}}},"f:spec":{"f:allocateLoadBalancerNodePorts":{},"f:externalTrafficPolicy":{},"f:internalTrafficPolicy":{},"f:ports":{".":{},"k:{\"port\":53,\"protocol\":\"UDP\"}":{".":{},"f:name":{},"f:port":{},"f:protocol":{},"f:targetPort":{}},"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:appProtocol":{},"f:name":{},"f:port":{},"f:protocol":{},"f:targetPort":{}},"k:{\"port\":9090,\"protocol\":\"TCP\"}":{".":{},"f:name":{},"f:port":{},"f:protocol":{},"f:targetPort":{}}},"f:selector":{},"f:sessionAffinity":{},"f:type":{}}}`)
	return s
}

// userSlice is the EndpointSlice controller's slice of Service svc with n
// pods, with its managed fields.
func userSlice(svc *corev1.Service, n int) *discoveryv1.EndpointSlice {
	s := workload.EndpointSlice(svc.Namespace, svc.Name, n)
	owned.ComputedSlice(s, svc)
	s.ManagedFields = managed("kube-controller-manager", `{"f:addressType":{},"f:endpoints":{},"f:metadata":{"f:annotations":{".":{},"f:endpoints.kubernetes.io/last-change-trigger-time":{}},"f:generateName":{},"f:labels":{".":{},"f:app":{},"f:endpointslice.kubernetes.io/managed-by":{},"f:kubernetes.io/service-name":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d\"}":{}}},"f:ports":{}}`)
	return s
}

// userIngress sends www.<name>.example.com to Service backend, with an
// ingress controller's annotations, TLS, paths and a load balancer's
// status.
func userIngress(namespace, name, backend string) *networkingv1.Ingress {
	port := networkingv1.ServiceBackendPort{Name: "http"}
	host := "www." + name + ".example.com"
	ing := &networkingv1.Ingress{
		TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "Ingress"},
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("ing-" + name), ResourceVersion: "234567",
			Labels: map[string]string{"app.kubernetes.io/name": name},
			Annotations: map[string]string{"cert-manager.io/cluster-issuer": "letsencrypt", "nginx.ingress.kubernetes.io/proxy-body-size": "8m",
				"nginx.ingress.kubernetes.io/configuration-snippet": "more_set_headers \"X-Frame-Options: DENY\";\nmore_set_headers \"X-Content-Type-Options: nosniff\";"}},
		Spec: networkingv1.IngressSpec{
			IngressClassName: ptr.To("nginx"),
			TLS:              []networkingv1.IngressTLS{{Hosts: []string{host, "api." + name + ".example.com"}, SecretName: name + "-tls"}},
			DefaultBackend:   &networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: backend, Port: port}},
			Rules: []networkingv1.IngressRule{
				{Host: host, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{Paths: []networkingv1.HTTPIngressPath{
					{Path: "/", PathType: ptr.To(networkingv1.PathTypePrefix), Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: backend, Port: port}}},
					{Path: "/static", PathType: ptr.To(networkingv1.PathTypePrefix), Backend: networkingv1.IngressBackend{
						Resource: &corev1.TypedLocalObjectReference{APIGroup: ptr.To("k8s.example.com"), Kind: "StorageBucket", Name: "static"}}},
				}}}},
				{Host: "api." + name + ".example.com", IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{Paths: []networkingv1.HTTPIngressPath{
					{Path: "/v1", PathType: ptr.To(networkingv1.PathTypeExact), Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{Name: backend + "-api", Port: networkingv1.ServiceBackendPort{Number: 8080}}}},
				}}}},
			},
		},
		Status: networkingv1.IngressStatus{LoadBalancer: networkingv1.IngressLoadBalancerStatus{Ingress: []networkingv1.IngressLoadBalancerIngress{{IP: "203.0.113.7"}}}},
	}
	lastApplied(ing, ing.Spec)
	ing.ManagedFields = managed("kubectl-client-side-apply", `{"f:metadata":{"f:annotations":{".":{},"f:cert-manager.io/cluster-issuer":{},"f:kubectl.kubernetes.io/last-applied-configuration":{},"f:nginx.ingress.kubernetes.io/configuration-snippet":{},"f:nginx.ingress.kubernetes.io/proxy-body-size":{}},"f:labels":{".":{},"f:app.kubernetes.io/name":{}}},"f:spec":{"f:defaultBackend":{".":{},"f:service":{".":{},"f:name":{},"f:port":{".":{},"f:name":{}}}},"f:ingressClassName":{},"f:rules":{},"f:tls":{}}}`)
	return ing
}

// A target as the controller makes it, its objects in the shape a
// cluster holds them: PodAutoscaler hello (public Service hello),
// ServerlessService, private Service with two slices.

func autoscaler(name, service string) *v1alpha1.PodAutoscaler {
	return &v1alpha1.PodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, UID: types.UID("pa-" + name), CreationTimestamp: metav1.Unix(1795000000, 0),
			ManagedFields: managed("sockscale-controller", `{"f:spec":{}}`)},
		Spec: v1alpha1.PodAutoscalerSpec{
			ScaleTargetRef:       v1alpha1.ScaleTargetRef{APIVersion: "apps/v1", Kind: "Deployment", Name: name},
			Service:              v1alpha1.ServiceRef{Name: service, Port: 80},
			ContainerConcurrency: 4, TimeoutSeconds: ptr.To[int32](30),
		},
	}
}

func serverless(pa *v1alpha1.PodAutoscaler, activators ...string) *v1alpha1.ServerlessService {
	return owned.ServerlessService(&v1alpha1.ServerlessService{
		ObjectMeta: metav1.ObjectMeta{Namespace: pa.Namespace, Name: pa.Name, UID: types.UID("sks-" + pa.Name),
			ManagedFields: managed("sockscale-controller", `{"f:spec":{}}`)},
		Spec: v1alpha1.ServerlessServiceSpec{Mode: v1alpha1.ModeServe, PublicService: pa.Spec.Service.Name, Port: 80,
			Selector: map[string]string{"app.kubernetes.io/name": pa.Name}},
		Status: v1alpha1.ServerlessServiceStatus{Mode: v1alpha1.ModeServe, Activators: activators},
	}, pa)
}

func privateService(s *v1alpha1.ServerlessService) *corev1.Service {
	svc := userService(s.Namespace, s.Spec.PublicService+"-private")
	svc.Spec.Type, svc.Status = corev1.ServiceTypeClusterIP, corev1.ServiceStatus{}
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs = "10.96.99.1", []string{"10.96.99.1"}
	return owned.PrivateService(svc, s)
}

// privateSlice is slice i of the private Service, its pods numbered from
// first; every third not ready, every fifth terminating.
func privateSlice(svc *corev1.Service, i, first, n int) *discoveryv1.EndpointSlice {
	s := userSlice(svc, 0)
	s.Name = fmt.Sprintf("%s-%d", svc.Name, i)
	for j := first; j < first+n; j++ {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.244.%d.%d", j/256, j%256)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(j%3 != 0), Serving: ptr.To(j%3 != 0), Terminating: ptr.To(j%5 == 0)},
			NodeName:   ptr.To(fmt.Sprintf("node-%d", j%7)), Zone: ptr.To("zone-a"),
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: svc.Namespace, Name: fmt.Sprintf("hello-abc-%d", j), UID: types.UID(fmt.Sprint("pod-", j))},
		})
	}
	return s
}

// routeService is a Service the controller gives serving Route name.
func routeService(name, route, tag string) *corev1.Service {
	s := userService("shop", name)
	s.Labels[servingv1alpha1.RouteLabelKey] = route
	if tag != "" {
		s.Labels[servingv1alpha1.TagLabelKey] = tag
	}
	return s
}
